"""One admission decision for a request the router forwards, REST and gRPC alike.

After the router's allow/deny decision (`policy.routing`) and before a byte reaches Triton, every
relay asks `admit` what becomes of the call: relayed now, relayed once its model's limiter gives
a slot, refused with the pod's quarantine, or answered here about readiness (the proxy draining,
the node pod stopping, every model asleep or parked, the model parked at zero). The REST relay
asks per request head (`http1.gate`), the gRPC relay per unary call's message and per request
message of a stream (`grpc.gate`: a quarantined stream's message is refused in the stream, which
goes on) and at a ServerReady call's headers (`grpc.relay`), grpc.aio per call (`grpc.grpcio`);
each renders the verdict in its own protocol (docs/proxy.md's table). Quarantine is its first
rule: no relay checks it before asking.

What it must not do: read anything but its arguments, take a slot or write anything.
"""

from __future__ import annotations

from typing import Final

from proxy.policy.limiter import Limiter
from proxy.processflags import ProxyState

FORWARD: Final = 0
"""Relay the call to Triton now (a health or readiness call: Triton answers it)."""
SLOT_FIRST: Final = 1
"""Relay the call once its limiter gives a slot: an inference call, or any call of a parked model
(it waits for the model's wake, `proxy.parking`)."""
QUARANTINED: Final = 2
"""Refuse the call with the limiter's refusal: the node quarantined the pod. Every call, its
readiness too, so that the pod is not ready and its Service sends elsewhere."""
DRAINING: Final = 3
"""Answer the pod's readiness not ready here: the proxy is shutting down."""
STOPPING: Final = 4
"""Answer a readiness call not ready here, saying why: the node gateway takes the model pod out
of its Service while the node pod stops (`Limiter.unready`)."""
ASLEEP: Final = 5
"""Answer the pod's readiness ready here: every model it serves is on-demand and asleep or
parked at zero replicas (`ProxyState.model_asleep`), so Triton has none of them loaded, and
their next requests wake them: the pod stays in their Services."""
PARKED: Final = 6
"""Answer the model's readiness not ready here: it is parked at zero replicas; asking wakes
nothing, its other calls do."""


def admit(
    readiness: bool,
    model_ready: bool,
    limited: bool,
    parked: bool,
    limiter: Limiter,
    state: ProxyState,
) -> int:
    """The verdict on a forwarded call: `readiness` (it answers the pod's readiness: REST
    /v2/health/ready, gRPC ServerReady), `model_ready` (it asks the model's readiness),
    `limited` (an inference call), `parked` (its model is parked at zero), under its model's
    `limiter` (its `refusal`: the pod is quarantined; its `unready`: the pod leaves its
    Service), in the proxy's `state`. Positional: a keyword call costs the uncompiled relays
    more, per request. The verdicts that go to Triton are the lowest, so that one comparison
    tells them."""
    if limiter.refusal is not None:
        return QUARANTINED
    if readiness or model_ready:
        if readiness and state.draining:
            return DRAINING
        if limiter.unready:
            return STOPPING
        if readiness and state.model_asleep:
            return ASLEEP
        if parked and model_ready:
            return PARKED
        return FORWARD
    if limited or parked:
        return SLOT_FIRST
    return FORWARD
