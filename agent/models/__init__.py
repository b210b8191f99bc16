"""The models on this node: install, load, unload, eviction and reconciliation against the pods
bound to it."""
