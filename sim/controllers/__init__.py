"""The simulated cluster's kube-controller-manager: the Deployment and ReplicaSet controllers and
the garbage collector of their objects, as API clients (`manager` runs them; `deployment`,
`replicaset` and `podtemplate` are their arithmetic, pure)."""
