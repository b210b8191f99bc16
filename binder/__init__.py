"""The binder: tritonshare's scheduler for pods with `schedulerName: tritonshare`.

Pure core: `model` (API objects to immutable domain values), `rules` (Kubernetes' node rules),
`classes` and `index` (those rules evaluated once per kind of pod, feasible nodes by free memory),
`state` (the GPU memory ledger), `chargedpods` (which bound pods are charged), `placement` (filters,
scores, reasons), `consolidation` (which smaller pods to move to make room), `queue` (backoff),
`settings` and `errors`.
Edges: `kube` and `wire` (the only doors to the API server), `cache` (list+watch), `inbox` (work
handed from other threads to the event loop), `handover` (API writes handed to worker threads),
`controller` (decide and bind), `moves` (carry out a consolidation), `agentdown` (pods on a node
whose agent is down), `leader` (Lease election), `metrics`, `report` (what the CLI prints, from a
cache), `app` (wiring and the health server), `cli` (`tritonshare`). pyproject.toml's
import-linter contracts keep the core under the edges.
"""
