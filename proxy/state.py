"""What the proxy's transports share about the process, set only by the shutdown sequence.

Kept apart so the REST relay, the gRPC proxy and the readiness check read one flag without
importing each other.
"""

from __future__ import annotations


class ProxyState:
    """Whether the proxy is draining: reporting not ready while it still serves."""

    def __init__(self) -> None:
        self.draining = False
