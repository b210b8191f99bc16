"""The loader: a model pod's init container that gets its model READY in the node's Triton.

`python -m loader` checks the model directory (validate.py), hashes it (manifest.py), and drives
the node's agent (agentclient.py, the only module that speaks gRPC) through loading.py's retrying
flow; errors.py names every failure and its exit code. With --host it is a model host's
long-lived container: host.py follows the host's replicas, fetch.py fetches their files. It never
imports another part, `sim` or `kubernetes`: it meets the agent only through protos/agent.proto.
See docs/loader.md.
"""
