"""What the proxy's transports share about the process, set by the shutdown sequence, by the
proxy from its models' residency and parking, and by the caller key's keeper.

Kept apart so the REST relay, the gRPC proxy and the readiness check read one flag without
importing each other.
"""

from __future__ import annotations


class ProxyState:
    """Whether the proxy is draining (reporting not ready while it still serves), and whether
    every model it serves is asleep or parked (the pod stays ready: the next request wakes
    its model)."""

    def __init__(self) -> None:
        self.draining = False
        self.model_asleep = False
        """Set only by proxy.app, whenever its table or a model's residency or parking changes:
        the table is not empty and each of its models is on-demand and asleep (unloaded while
        idle) or parked at zero replicas. The readiness answers then say ready without asking
        Triton, which has none of them loaded (through the node gateway, which no longer knows
        a host with nothing loaded, the answer would be an error)."""
        self.caller_key = b""
        """The preamble this pod's connections to the node gateway begin with (its caller key,
        `common.callerkeys`), set by proxy.callerkey; empty: none (the gateway knows the pod by
        its address; the gateway's own relays to Triton never send one)."""
