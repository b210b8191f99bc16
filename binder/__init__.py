"""The binder: tritonshare's scheduler for pods with `schedulerName: tritonshare`.

Its subpackages, from the core up: `cluster` (immutable views of API objects, the informer cache,
the GPU-memory ledger, `chargedpods`: which bound pods are charged, Kubernetes' node rules),
`framework` (placement as kube-scheduler decides it: filters, scores, preemption, consolidation,
quotas, the queue), `pods` (the pod controller) and `tritonmodels` (the TritonModel controller),
`autoscaler` (the built-in autoscaler, scale to zero), `nodescaling` (what node autoscalers act
on), `api` (the only door to the API server: transport, typed client, leader election, the
hand-offs between threads and the loop) and `cli` (`tritonshare`); `reconciler`, `metrics`,
`settings`, `errors` and `app` (wiring and the health server) beside them. pyproject.toml's
import-linter contracts keep each layer under those above it.
"""
