"""The binder: tritonshare's scheduler for pods with `schedulerName: tritonshare`.

Pure core: `model` (API objects to immutable domain values), `rules` (Kubernetes' node rules),
`classes` and `index` (those rules evaluated once per kind of pod, feasible nodes by free memory),
`state` (the GPU memory ledger), `proofs` (which bound pods are charged), `placement` (filters,
scores, reasons), `queue` (backoff), `report` (what the CLI prints).
Edges: `kube` and `wire` (the only doors to the API server), `cache` (list+watch), `inbox` (work
handed from other threads to the event loop), `controller` (decide and bind), `leader` (Lease
election), `metrics`, `app` (wiring and the health server), `cli` (`tritonshare`).
"""
