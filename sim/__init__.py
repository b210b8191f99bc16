"""A simulated cluster for tests, benchmarks and the demo.

An in-memory Kubernetes API server (`sim.apiserver`), simulated GPU nodes (the mock NVML in
`sim.gpu.nvml`), a real Triton on the CPU (`sim.triton`), a small kubelet (`sim.node.kubelet`) with
stand-ins for a pod's network namespace (`sim.node.podnetwork`) and KServe's storage initializer
(`sim.node.storage_initializer`), and an HTTPS model store (`sim.modelstore`). The product never
imports this package; only tests, benchmarks and the demo do.
"""
