"""What the proxy's transports share about the process, set by the shutdown sequence, by the
model's residency and by the caller key's keeper.

Kept apart so the REST relay, the gRPC proxy and the readiness check read one flag without
importing each other.
"""

from __future__ import annotations


class ProxyState:
    """Whether the proxy is draining (reporting not ready while it still serves), and whether
    its on-demand model is asleep (the pod stays ready: the next request wakes it)."""

    def __init__(self) -> None:
        self.draining = False
        self.model_asleep = False
        """Set only by proxy.residency: the readiness answers then say ready without asking
        Triton, which no longer has the model loaded."""
        self.caller_key = b""
        """The preamble this pod's connections to the node gateway begin with (its caller key,
        `common.callerkeys`), set by proxy.callerkey; empty: none (the gateway knows the pod by
        its address; the gateway's own relays to Triton never send one)."""
