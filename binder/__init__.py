"""The binder: tritonshare's scheduler for pods with `schedulerName: tritonshare`.

Pure core: `model` (API objects to immutable domain values), `rules` (Kubernetes' node rules),
`state` (the GPU memory ledger), `placement` (filters, scores, reasons), `queue` (backoff).
Edges: `kube` (the only Kubernetes client user), `cache` (list+watch), `controller` (decide and
bind), `leader` (Lease election), `http` and `metrics`, `app` (wiring), `cli` (`tritonshare`).
"""
