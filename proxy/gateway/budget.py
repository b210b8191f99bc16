"""The gateway's worst-case memory as a formula of its flags (docs/proxy.md, "Worst-case memory").

What one calling pod can make the gateway hold, whatever it sends, from the relays' own bounds:
each connection holds at most `CONNECTION_BYTES` (a REST connection: its head, pipelined
requests, one compressed read being counted, and an answer being renamed; a gRPC connection:
a partial message or prefix on each of its streams, a header block, the header blocks its
decoder keeps and the plans made from them, a small message inflated inline), and each stream at
Triton or waiting for a slot (a ModelStreamInfer stream holds one slot per request in flight,
the last until its answers have left for the tenant; an idle one holds none and only its
connection's share) at most `STREAM_BYTES` (request bytes Triton's window
holds back, a response the tenant does not read, and a large message's name, request id and
inflated slice). Those bounds add up over pods; the node's byte budget (`--max-buffered-bytes`,
`policy.holdings`) bounds them together: `worst_case` is the base, twice the budget and
`HELD_SLACK`, whatever the number of pods. The deploy manifests set the gateway's memory limit
from it (a test keeps them in step). What it must not do: measure anything; it only adds the
relays' constants up.
"""

from __future__ import annotations

from typing import Final

from proxy.gateway.settings import GatewaySettings
from proxy.grpc.channel import RESPONSE_WINDOW
from proxy.grpc.connection import MAX_HEADER_BLOCK, MAX_STREAMS
from proxy.grpc.intake import HOLD_LIMIT, PREFIX_HOLD, SMALL_INFLATE
from proxy.grpc.stream import RECEIVE_WINDOW
from proxy.http1.connection import PIPELINE_LIMIT
from proxy.http1.framing import MAX_HEAD_BYTES
from proxy.http2.headers import KEPT_BYTES, KEPT_ENTRY_BYTES
from proxy.policy.inflation import SLICE
from proxy.policy.naming import HOLD
from proxy.policy.refusals import SMALL_REQUEST
from proxy.policy.shapes import MAX_JSON_BYTES
from proxy.policy.wire import CAPTURE

BASE_BYTES: Final = 64 * 1024**2
"""The process with no caller: interpreter, compiled relays, metrics (measured ~50-60 MiB)."""
_READ: Final = 256 * 1024
"""The most one socket read hands the relay (uvloop's read buffer)."""
_REST_CONNECTION: Final = (
    MAX_HEAD_BYTES + PIPELINE_LIMIT + _READ + SLICE + MAX_HEAD_BYTES + HOLD + MAX_JSON_BYTES
)
"""... and, for a model with a private name in Triton, an answer's head and start held to be
renamed (`http1.answers`), and an inference body's JSON part kept to check its shapes
(`policy.shapes`)."""
_GRPC_CONNECTION: Final = (
    MAX_STREAMS * (max(HOLD_LIMIT, PREFIX_HOLD, SMALL_REQUEST) + 5)
    + MAX_HEADER_BLOCK
    # The decoder's kept blocks and the relay's plans (`http2.headers`), and the last plan,
    # remembered after its memory started again.
    + 2 * KEPT_BYTES
    + KEPT_ENTRY_BYTES
    + SMALL_INFLATE
)
CONNECTION_BYTES: Final = max(_REST_CONNECTION, _GRPC_CONNECTION)
"""The most one connection holds outside the streams at Triton or queued (~4.2 MiB)."""
STREAM_BYTES: Final = RECEIVE_WINDOW + RESPONSE_WINDOW + 3 * CAPTURE + SLICE + HOLD
"""The most one inference stream at Triton or waiting for a slot holds (~1.8 MiB); an answer's
start held to be renamed (`naming.AnswerNames`) or read for the end of a request
(`finals.Finals`) is within Triton's window, its renamed copy is the HOLD; the third CAPTURE is
the ids of a ModelStreamInfer stream's requests in flight that asked for their empty final
answer (at most `L` per pod, one counted per stream)."""


def per_pod(settings: GatewaySettings, declared: int = 0) -> int:
    """The most one pod (declaring concurrency `declared`, 0: none) can make the gateway hold:
    its connections, and its inference requests in flight and queued (as many as in flight)."""
    limit = settings.in_flight_limit(declared)
    if limit == 0:
        raise ValueError("with --max-in-flight-per-pod=0 a pod's share has no bound")
    return settings.max_connections_per_pod * CONNECTION_BYTES + 2 * limit * STREAM_BYTES


HELD_SLACK: Final = 128 * 1024**2
"""What the gateway may hold past its bound for the pods' bytes: the read that trips a pod's
allowance (at most 256 KiB per pod being read), answers Triton sends in one walk (0.1 s) before
the walk counts them, the inflate slices and decompressors of streams being read in pieces
(`SLICE` each), and the allocator's own overhead."""


def held_bound(settings: GatewaySettings) -> int:
    """The most the gateway holds for every pod together under its byte budget: twice the
    budget (a pod over its share got there while the node was under the budget, and the pods
    under their share may reach it meanwhile), and once the grace passes, the budget."""
    if settings.max_buffered_bytes == 0:
        raise ValueError(
            "with --max-buffered-bytes=0 the pods' holdings have no node-wide bound: only each "
            "pod's own (per_pod), summed over every pod"
        )
    return 2 * settings.max_buffered_bytes


def worst_case(settings: GatewaySettings) -> int:
    """The most the gateway's process holds, whatever its pods send and however many there are:
    its base, the pods' bytes under the byte budget, and the slack."""
    return BASE_BYTES + held_bound(settings) + HELD_SLACK
