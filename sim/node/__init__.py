"""One simulated node's kubelet: pods run as local processes, with their own addresses, volumes,
probes and status (`kubelet` watches, `podworker` runs one pod, `containers` one process;
`nodepods` restarts the node pods `sim.cluster` runs itself)."""
