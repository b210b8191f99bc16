"""The cluster as the binder sees it: immutable views of API objects, the informer cache and the
GPU-memory ledger, and Kubernetes' own node rules."""
