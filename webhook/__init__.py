"""The mutating admission webhook: a pod with a few annotations becomes a complete model pod.

Its own part, beside agent/binder/loader/proxy: it imports none of them (import-linter), only
common/ for the contract's keys, quantities and model ids.
"""
