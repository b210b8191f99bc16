"""Leader election through a coordination.k8s.io/v1 Lease, as client-go's leaderelection does.

Every replica tries to acquire or renew the Lease each retry period. A replica that does not hold
it judges the holder's lease expired by its own clock: the time it last saw the record change,
plus the record's leaseDurationSeconds, so clock skew between replicas does not matter. Writes
carry the Lease's resourceVersion, so two candidates cannot both win (the loser gets 409). A
leader that fails to renew for the renew deadline steps down, whatever the failure (refused,
reset, 5xx, or an attempt that hangs: each attempt is cut at the time left before the deadline,
as client-go's renew loop runs under a context with that deadline), so it stops binding before
the lease can expire and a follower take over. A leader that stops cleanly releases the Lease so
a follower takes over at once.

Owns the Lease and the `leading` flag; knows nothing about scheduling.

Why not the kubernetes client's `kubernetes.leaderelection` (read at kubernetes 37.0.2, the venv's):
- Transport: its locks (LeaseLock, ConfigMapLock) call the generated CoordinationV1Api on the
  client's own ApiClient; the binder reaches the API server through one transport (binder.api.kube),
  whose auth, TLS and proxy settings the lease would bypass.
- Threading: `LeaderElection.run()` blocks its thread in `time.sleep` loops and starts
  `onstarted_leading` on a daemon thread; it has no stop, so it cannot end with the binder's
  asyncio lifecycle, and it never releases the Lease: a clean shutdown leaves followers waiting
  a full lease duration, where this one releases it.
- Clock: it judges the holder's expiry and its own renew deadline by the wall clock
  (`time.time()`), which an NTP step moves; this one uses the monotonic clock.
- Renew semantics: an attempt is a plain blocking request with no deadline, so a hung renewal
  keeps a leader believing it leads past its renew deadline (and past the lease); this one cuts
  each attempt at the time left before the deadline and steps down.
- Settings: its Config calls `sys.exit` on a bad value and wants periods of at least one second
  (tests here use fractions), and it writes no annotations, where the leader's Lease carries
  what it decides with.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from types import MappingProxyType
from typing import Any

from binder.api.kube import Kube
from binder.api.leases import micro_time
from common.kubeapi.errors import ApiError, ConflictError
from common.kubeapi.session import JsonObject

log = logging.getLogger(__name__)


class LeaderElector:
    """Acquires and renews the leader Lease; `leading` is set while this replica leads."""

    def __init__(
        self,
        kube: Kube,
        leading: asyncio.Event,
        *,
        namespace: str,
        name: str,
        identity: str,
        lease_duration: float,
        renew_deadline: float,
        retry_period: float,
        executor: Executor,
        on_change: Callable[[bool], None] = lambda leading: None,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        annotations: Mapping[str, str] = MappingProxyType({}),
    ) -> None:
        self._kube = kube
        self._annotations = dict(annotations)
        """Written on the Lease by the replica that holds it: what the leader decides with."""
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self._duration = lease_duration
        self._renew_deadline = renew_deadline
        self._retry = retry_period
        self._executor = executor
        self._on_change = on_change
        self._monotonic = monotonic
        self._wall = wall
        self.leading = leading
        """Set here while this replica leads; the writers and the scheduling loop read it."""
        self.release_on_stop = True
        """Release the Lease when `run` ends while leading (False mimics a crash)."""
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._last_renew = 0.0

    @property
    def is_leader(self) -> bool:
        return self.leading.is_set()

    def _spec(self, old: JsonObject | None) -> JsonObject:
        now = micro_time(self._wall())
        previous = (old or {}).get("spec") or {}
        taking_over = previous.get("holderIdentity") != self.identity
        transitions = int(previous.get("leaseTransitions") or 0)
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, math.ceil(self._duration)),
            "acquireTime": now if taking_over else previous.get("acquireTime", now),
            "renewTime": now,
            "leaseTransitions": transitions + 1 if taking_over and old is not None else transitions,
        }

    def try_acquire_or_renew(self, timeout: float | None = None) -> bool:
        """One attempt (blocking): True when this replica holds the Lease afterwards. `timeout`
        bounds each API call, in seconds (the client's default when None)."""
        limit = {} if timeout is None else {"timeout": timeout}
        lease = self._kube.get_lease(self.namespace, self.name, **limit)
        if lease is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": self.name,
                    "namespace": self.namespace,
                    **({"annotations": dict(self._annotations)} if self._annotations else {}),
                },
                "spec": self._spec(None),
            }
            try:
                self._kube.create_lease(self.namespace, body, **limit)
            except ConflictError:
                return False
            return True
        spec = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        record = (holder, spec.get("renewTime"), spec.get("leaseDurationSeconds"))
        now = self._monotonic()
        if record != self._observed:
            self._observed = record
            self._observed_at = now
        duration = float(spec.get("leaseDurationSeconds") or self._duration)
        if holder and holder != self.identity and self._observed_at + duration > now:
            return False
        lease["spec"] = {**spec, **self._spec(lease)}
        if self._annotations:
            metadata = lease.setdefault("metadata", {})
            metadata["annotations"] = {**(metadata.get("annotations") or {}), **self._annotations}
        try:
            self._kube.replace_lease(self.namespace, self.name, lease, **limit)
        except ConflictError:
            return False
        return True

    def release(self) -> None:
        """Give the Lease up (blocking) so a follower need not wait for it to expire."""
        lease = self._kube.get_lease(self.namespace, self.name)
        if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
            return
        now = micro_time(self._wall())
        lease["spec"] = {
            **lease["spec"],
            "holderIdentity": "",
            "leaseDurationSeconds": 1,
            "renewTime": now,
            "acquireTime": now,
        }
        self._kube.replace_lease(self.namespace, self.name, lease)

    def _set(self, leading: bool, *, stopping: bool = False) -> None:
        if leading == self.is_leader:
            return
        if leading:
            self.leading.set()
            log.info("This replica (%s) is now the leader: it binds pods.", self.identity)
        else:
            self.leading.clear()
            if stopping:
                log.info("This replica (%s) stops leading: it is shutting down.", self.identity)
            else:
                log.warning(
                    "This replica (%s) could not renew the leader lease: it stops binding and "
                    "keeps its caches.",
                    self.identity,
                )
        self._on_change(leading)

    def _time_left(self) -> float:
        """Seconds an attempt may take: while leading, what is left before the renew deadline
        (at least a tenth of a second); otherwise the renew deadline."""
        if not self.is_leader:
            return self._renew_deadline
        return max(0.1, self._last_renew + self._renew_deadline - self._monotonic())

    async def _attempt(self, loop: asyncio.AbstractEventLoop) -> bool:
        """One attempt off the loop, never longer than the time left; False on any failure."""
        limit = self._time_left()
        attempt = loop.run_in_executor(self._executor, self.try_acquire_or_renew, limit)
        try:
            return await asyncio.wait_for(attempt, timeout=limit)
        except TimeoutError:
            log.warning(
                "The leader lease could not be read or written within %.1f s: the API server "
                "does not answer.",
                limit,
            )
        except ApiError as e:
            log.warning("The leader lease could not be read or written: %s.", e)
        return False

    async def run(self, stop: asyncio.Event) -> None:
        """Campaign until `stop`; release the Lease on the way out if leading (and asked to)."""
        loop = asyncio.get_running_loop()
        try:
            while not stop.is_set():
                held = await self._attempt(loop)
                now = self._monotonic()
                if held:
                    self._last_renew = now
                    self._set(True)
                elif self.is_leader and now - self._last_renew >= self._renew_deadline:
                    self._set(False)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self._retry)
        finally:
            was_leader = self.is_leader
            self._set(False, stopping=True)
            if was_leader and self.release_on_stop:
                try:
                    await loop.run_in_executor(self._executor, self.release)
                    log.info("Released the leader lease for a quick takeover.")
                except (ApiError, RuntimeError) as e:
                    log.warning("Releasing the leader lease has failed (%s): it will expire.", e)
