"""A simulated cluster for tests, benchmarks and the demo.

An in-memory Kubernetes API server (`sim.apiserver`), simulated GPU nodes (the mock NVML in
`sim.nvml`), a real Triton on the CPU (`sim.triton`) and a small kubelet (`sim.kubelet`). The
product never imports this package; only tests, benchmarks and the demo do.
"""
