"""What the proxy's transports share about the process, set by the shutdown sequence and by
the model's residency.

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
