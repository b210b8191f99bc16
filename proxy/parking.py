"""Scale to zero's activator in a model host's proxy: the requests of a model parked here.

A TritonModel scaled to zero replicas is parked by the binder on one of its namespace's model hosts
(the node of its last replica); the host stays behind the model's Service (while every model it
serves is parked or asleep, its proxy answers the host's readiness itself, ready:
`ProxyState.model_asleep`), and its loader lists the model, under the id its clients send
(spec.modelName), with `parked` in the models file until a replica of it is ready here. A call for a
parked model, REST or gRPC, inference, metadata, config or statistics, waits (`Parked.wake`, the
limiter's `Sleeper`), counted as held by the model's limiter: the built-in autoscaler reads that as
the model's concurrency, scales it to one or more replicas, and does not scale it back to zero while
calls wait. The call goes on once the entry is served (`unpark`), or is answered 503 with
Retry-After (gRPC UNAVAILABLE with `retry-after` and `grpc-retry-pushback-ms` trailers) past
--wake-timeout-seconds, never left hanging. Its readiness (REST and gRPC ModelReady) is answered at
once, not ready, and wakes nothing (`routing.parked_message`): a probe must not keep a model from
zero.

Bounds: the host is its namespace's own pod, so it holds that namespace's requests only; at
most the model's queue limit (without a concurrency limit, the host's) wait for one model, and
at most `most_total` for all the host's parked models; past either a request is answered 503
with Retry-After at once. Pure asyncio: no I/O.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from proxy.policy.refusals import WakeError

log = logging.getLogger(__name__)

RETRY_SECONDS = 1
"""The Retry-After of a request refused or timed out while its model is parked."""
MOST_WAITING = 1024
"""The most requests a host holds for all its parked models together."""


class Parking:
    """The host's parked models and the requests waiting for them all."""

    def __init__(self, most_total: int) -> None:
        self.most_total = most_total
        self.waiting = 0
        """Requests waiting for any parked model of the host now."""
        self.models: dict[str, Parked] = {}

    def asleep(self, model_id: str) -> bool:
        """Whether `model_id` is parked here (its readiness is not asked of Triton)."""
        parked = self.models.get(model_id)
        return parked is not None and parked.asleep

    def park(self, model_id: str, most: Callable[[], int], wait_seconds: float) -> Parked:
        parked = self.models.get(model_id)
        if parked is None or not parked.asleep:
            parked = self.models[model_id] = Parked(model_id, self, most, wait_seconds)
            log.info("Model %s has no replica: holding its requests until one is ready.", model_id)
        return parked

    def unpark(self, model_id: str, *, gone: bool = False) -> None:
        """A replica of `model_id` is ready here: its requests go on; or (`gone`) it left the
        host (a replica is served elsewhere): they are answered 503 with Retry-After, and the
        client's next try goes where the Service now points."""
        parked = self.models.pop(model_id, None)
        if parked is not None:
            parked.unpark(gone=gone)


class Parked:
    """One parked model: asleep until `unpark`; `wake` waits for that, within the bounds."""

    def __init__(
        self,
        model_id: str,
        parking: Parking,
        most: Callable[[], int],
        wait_seconds: float,
    ) -> None:
        self.model_id = model_id
        self.asleep = True
        self.waiting = 0
        self._parking = parking
        self._most = most
        """The most requests that may wait for this model (its queue limit now)."""
        self.wait_seconds = wait_seconds
        self._gone = False
        self._ready: asyncio.Event | None = None

    def unpark(self, *, gone: bool = False) -> None:
        self.asleep = False
        self._gone = gone
        if self._ready is not None:
            self._ready.set()

    async def wake(self) -> None:
        """Return once the model is served here; WakeError (503, Retry-After) when its bounds
        are full or it is not within `wait_seconds`."""
        if not self.asleep:
            return
        parking = self._parking
        if self.waiting >= self._most() or parking.waiting >= parking.most_total:
            raise WakeError(
                f"model {self.model_id} is scaled to zero and is starting; this host holds "
                f"{self.waiting} of its requests ({parking.waiting} of all its parked models'), "
                f"its most; retry in {RETRY_SECONDS} s",
                retry_after=RETRY_SECONDS,
            )
        if self._ready is None:
            self._ready = asyncio.Event()
        self.waiting += 1
        parking.waiting += 1
        try:
            async with asyncio.timeout(self.wait_seconds):
                await self._ready.wait()
        except TimeoutError:
            raise WakeError(
                f"model {self.model_id} is scaled to zero and no replica of it was ready "
                f"within {self.wait_seconds:g} s; retry in {RETRY_SECONDS} s",
                retry_after=RETRY_SECONDS,
            ) from None
        finally:
            self.waiting -= 1
            parking.waiting -= 1
        if self._gone:
            raise WakeError(
                f"model {self.model_id} is now served by another host; retry in {RETRY_SECONDS} s",
                retry_after=RETRY_SECONDS,
            )
