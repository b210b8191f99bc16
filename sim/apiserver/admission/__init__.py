"""Admission, as kube-apiserver runs it on a write: mutating webhooks (`webhooks`), then, after
the object's own validation, ValidatingAdmissionPolicies (`policies`, with their CEL in `cel`).
`matching` holds the rules and selectors both use. See docs/sim.md for what is simulated.
"""
