"""The built-in autoscaler's loop: reads the proxies' counts once a `period`, decides with
`binder.autoscaler` (Knative's KPA) and writes each target's replicas through its `scale`
subresource, on the leader only. Targets (`binder.scaletargets`): TritonModels with
spec.autoscaling, and Deployments of model pods with `autoscaling.knative.dev/target`.

Where the counts come from: every proxy (a model host's, a model pod's) serves, on its metrics
port, the cumulative held request-seconds and answered requests of each model it serves
(`/autoscaling`, a few bytes a model). Each tick the loop asks every proxy of a scaled target
once, all side by side, with a timeout under the period: one request per pod per period however
many models a host serves, and O(1) work a model to decide. The proxy counts queued requests too,
as Knative's queue-proxy does, which the node gateway (past the queue) would not see. Addresses
come from the binder's pod watch (the ledger's hosts; model pods through `Index.apply_pod`); no
Prometheus in between. The same read serves awake first (`binder.room`): the hosts of every
on-demand TritonModel with replicas to spare and a capacity are read too, and their held seconds
handed to the model controller (`on_load`), so one request per host a period serves both.

One owner of `scale` at a time: an object an autoscaling/v2 HorizontalPodAutoscaler targets
(KEDA's ScaledObject makes one) is left to it. A TritonModel's `Autoscaling` condition says who
scales it (reason `BuiltIn`, `HorizontalPodAutoscaler`, `KEDAScaledObject` or `InvalidSettings`);
a Deployment's status is its controller's, so it gets an Event with that reason when it changes.
Until the HPAs and Deployments have been listed the loop scales nothing. Its windows start afresh
when this replica begins to lead; a follower decides nothing, and a write stops being retried once
leadership is lost (`Kube._write`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import Executor
from functools import partial
from typing import Any

import aiohttp

from binder.autoscaler import Decider, Decision, Scaling
from binder.cache import Informer, Ledger
from binder.inbox import Inbox
from binder.kube import Kube, now_rfc3339
from binder.room import needs_room
from binder.scaletargets import Index, Target, host_sources, model_target
from common.contract import PROXY_AUTOSCALING_PATH, Keys

log = logging.getLogger(__name__)

DEFAULT_KEYS = Keys()

CONDITION = "Autoscaling"
GROUPS = {
    "TritonModel": ("tritonshare.io", "v1alpha1", "tritonmodels"),
    "Deployment": ("apps", "v1", "deployments"),
}
Counts = Mapping[str, list[float]]
Source = tuple[str, str, str]
"""(source, address, model): `Target.sources`."""
Readings = Mapping[str, Mapping[str, float]]
"""Model uid -> source (node) -> the seconds its requests were held there (cumulative)."""
Report = tuple[str, str, str]
"""(status, reason, message) of who scales a target."""
MAX_ANSWER_BYTES = 1 << 20
"""The most of one proxy's /autoscaling answer read (a host of 10,000 models answers ~400 KiB)."""
PARALLEL_READS = 64
"""Proxies read at once."""
MAX_SOURCES_EXTRA = 5
"""A Deployment's pods read beyond its replicas (a roll's surge): more pods matching its selector,
which its namespace could create, cost the binder no more reads."""
REWRITE_SECONDS = 5.0
"""A condition written that the cache does not show after this long is written again (the
model controller's status write may have replaced the list meanwhile)."""


def describe(scaling: Scaling) -> str:
    top = scaling.max_replicas or "no limit"
    return (
        f"the built-in autoscaler scales on {scaling.metric}, target {scaling.target:g} per "
        f"replica at {scaling.utilization * 100:g} %, {scaling.min_replicas} to {top} "
        f"replicas, stable window {scaling.window:g} s, panic window "
        f"{scaling.panic_window:g} s at {scaling.panic_threshold_percentage:g} %"
    )


class Autoscaling:
    """The loop, its informers (HPAs, Deployments) and one `Decider` per scaled target."""

    def __init__(
        self,
        kube: Kube,
        ledger: Ledger,
        index: Index,
        *,
        leading: asyncio.Event,
        executor: Executor,
        inbox: Inbox,
        period: float,
        port: int,
        identity: str,
        keys: Keys = DEFAULT_KEYS,
        monotonic: Callable[[], float] = time.monotonic,
        on_load: Callable[[float, Readings], None] | None = None,
    ) -> None:
        self._kube = kube
        self._ledger = ledger
        self.index = index
        self._leading = leading
        self._executor = executor
        self._inbox = inbox
        self.period = period
        self._port = port
        self._identity = identity
        self._keys = keys
        self._monotonic = monotonic
        self._on_load = on_load
        """Told each tick the held seconds of the models `binder.room` reads."""
        self._deciders: dict[str, Decider] = {}
        self._asked: dict[str, tuple[int, int]] = {}
        """Target uid -> (replicas last asked, the generation then), until the cache shows it."""
        self._written: dict[str, tuple[Report | None, float]] = {}
        """Target uid -> (the report last written, when), until the cache shows it."""
        self.informers: list[Informer] = []
        self._reads = asyncio.Semaphore(PARALLEL_READS)

    async def run(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        index = self.index
        for kind, on_list, on_event in (
            (self._kube.horizontal_pod_autoscalers(), index.replace_hpas, index.apply_hpa),
            (self._kube.deployments(), index.replace_deployments, index.apply_deployment),
        ):
            informer = Informer(
                self._kube, kind, loop, on_list=on_list, on_event=on_event, inbox=self._inbox
            )
            informer.start()
            self.informers.append(informer)
        timeout = aiohttp.ClientTimeout(total=max(0.2, self.period * 0.8))
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session:
                while not stop.is_set():
                    if not self._leading.is_set():
                        # A new leader starts its windows afresh.
                        for memory in (self._deciders, self._asked, self._written):
                            memory.clear()
                        await _first(stop.wait(), self._leading.wait())
                        continue
                    started = self._monotonic()
                    try:
                        await self.tick(session)
                    except Exception:
                        log.exception("An autoscaling tick has failed: trying again next period.")
                    left = self.period - (self._monotonic() - started)
                    if left > 0:
                        await _first(stop.wait(), asyncio.sleep(left))
        finally:
            # Their watches are cut and joined with the binder's (`Binder._stop_watches`).
            for informer in self.informers:
                informer.stop()

    def targets(self) -> list[Target]:
        hosts = self._ledger.hosts
        found = [
            target
            for model in list(self._ledger.models.values())
            if (target := model_target(model, hosts.get(model.namespace) or {}, self._keys))
            is not None
        ]
        return [*found, *self.index.deployment_targets()]

    async def tick(self, session: aiohttp.ClientSession) -> None:
        """One read of the proxies, one decision and at most one write per scaled target."""
        if len(self.index.listed) < 2:
            return
        scaled: list[tuple[Target, Scaling]] = []
        targets = self.targets()
        await self._clear_stale()
        for target in targets:
            owner = self.index.owner(
                target.namespace, GROUPS[target.kind][0], target.kind, target.name
            )
            if owner is not None:
                reason, message = owner
                await self._report(
                    target, ("False", reason, f"{message}: the built-in autoscaler leaves it alone")
                )
            elif target.scaling is None:
                await self._report(target, ("False", "InvalidSettings", target.problem))
            else:
                await self._report(target, ("True", "BuiltIn", describe(target.scaling)))
                scaled.append((target, target.scaling))
        self._forget({target.uid for target, _ in scaled}, {t.uid for t in targets})
        hosts = self._ledger.hosts
        room = [
            (model.uid, list(host_sources(model, hosts.get(model.namespace) or {})))
            for model in list(self._ledger.models.values())
            if self._on_load is not None and needs_room(model)
        ]
        addresses = sorted(
            {
                address
                for target, _ in scaled
                for _, address, _ in target.sources[
                    : max(target.replicas, target.ready) + MAX_SOURCES_EXTRA
                ]
            }
            | {address for _, sources in room for _, address, _ in sources}
        )
        answers = await asyncio.gather(*(self._read(session, a) for a in addresses))
        counts = dict(zip(addresses, answers, strict=True))
        now = self._monotonic()
        if self._on_load is not None and self._leading.is_set():
            self._on_load(now, _held(room, counts))
        for target, scaling in scaled:
            column = 0 if scaling.metric == "concurrency" else 1
            counters: dict[str, float] = {}
            for source, address, model in target.sources:
                answer = counts.get(address) or {}  # one not read: no counters from it
                entries = [answer[model]] if model in answer else [] if model else answer.values()
                for entry in entries:
                    counters[source] = counters.get(source, 0.0) + float(entry[column])
            decider = self._deciders.setdefault(target.uid, Decider())
            decider.observe(now, counters, scaling)
            current = target.replicas
            asked = self._asked.get(target.uid)
            if asked is not None:
                if target.generation > asked[1]:
                    del self._asked[target.uid]
                else:
                    current = asked[0]
            decision = decider.decide(now, scaling, target.ready, current)
            if decision.replicas != current and self._leading.is_set():
                await self._scale(target, current, scaling, decision)

    def _forget(self, scaled: set[str], targets: set[str]) -> None:
        for memory in (self._deciders, self._asked):
            for uid in set(memory) - scaled:
                del memory[uid]
        for uid in set(self._written) - targets:
            del self._written[uid]

    async def _clear_stale(self) -> None:
        """Remove the condition of a TritonModel whose spec.autoscaling is gone."""
        for model in list(self._ledger.models.values()):
            conditions = model.status.get("conditions") or []
            if model.autoscaling is not None or not any(
                isinstance(c, dict) and c.get("type") == CONDITION for c in conditions
            ):
                continue
            written = self._written.get(model.uid)
            if (
                written is not None
                and written[0] is None
                and self._monotonic() - written[1] < REWRITE_SECONDS
            ):
                continue
            kept = [c for c in conditions if isinstance(c, dict) and c.get("type") != CONDITION]
            if await self._call(
                f"Removing the Autoscaling condition of TritonModel {model.key}",
                self._kube.patch_model_status,
                model.namespace,
                model.name,
                model.uid,
                {"conditions": kept},
            ):
                self._written[model.uid] = (None, self._monotonic())

    async def _read(self, session: aiohttp.ClientSession, address: str) -> Counts:
        async with self._reads:
            return await read_counts(session, f"http://{address}:{self._port}")

    async def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, partial(fn, *args, **kwargs))
        except Exception as e:
            log.warning("%s has failed (%s).", what, e)
            return False
        return True

    def _event(self, target: Target, reason: str, message: str, kind: str) -> Awaitable[bool]:
        group, version, _ = GROUPS[target.kind]
        involved = {
            "apiVersion": f"{group}/{version}",
            "kind": target.kind,
            "namespace": target.namespace,
            "name": target.name,
            "uid": target.uid,
        }
        return self._call(
            f"Recording a {reason} Event for {target.kind} {target.key}",
            self._kube.record_object_event,
            involved,
            reason=reason,
            message=message,
            reporting_instance=self._identity,
            event_type=kind,
        )

    async def _scale(
        self, target: Target, current: int, scaling: Scaling, decision: Decision
    ) -> None:
        mode = "panic" if decision.panicking else "stable"
        window = scaling.panic_window if decision.panicking else scaling.window
        observed = decision.panic if decision.panicking else decision.stable
        message = (
            f"New size: {decision.replicas}; reason: {scaling.metric} {observed:.2f} over the "
            f"{window:g} s {mode} window, target {scaling.target * scaling.utilization:g} per "
            "replica"
        )
        log.info("%s %s scales from %d: %s", target.kind, target.key, current, message)
        group, version, plural = GROUPS[target.kind]
        api = f"/apis/{group}/{version}"
        if not await self._call(
            f"Scaling {target.kind} {target.key}",
            self._kube.scale,
            api,
            plural,
            target.namespace,
            target.name,
            decision.replicas,
        ):
            return
        # Until the cache sees the new spec.replicas (a new generation), it is the current one.
        self._asked[target.uid] = (decision.replicas, target.generation)
        await self._event(target, "SuccessfulRescale", message, "Normal")

    async def _report(self, target: Target, wanted: Report) -> None:
        """Say who scales the target: a TritonModel's condition, a Deployment's Event; written
        only when it changes."""
        if not self._leading.is_set():
            return
        written = self._written.get(target.uid)
        fresh = written is not None and self._monotonic() - written[1] < REWRITE_SECONDS
        if target.kind == "Deployment":
            if written is None or written[0] != wanted:
                status, reason, message = wanted
                kind = "Warning" if reason == "InvalidSettings" else "Normal"
                if await self._event(target, reason, message, kind):
                    self._written[target.uid] = (wanted, self._monotonic())
            return
        conditions = [c for c in target.status.get("conditions") or [] if isinstance(c, dict)]
        old = next((c for c in conditions if c.get("type") == CONDITION), None)
        if old is not None and (old.get("status"), old.get("reason"), old.get("message")) == wanted:
            return
        if fresh and written is not None and written[0] == wanted:
            return  # written, and the cache has not seen it yet
        status, reason, message = wanted
        kept = old is not None and old.get("status") == status
        conditions = [c for c in conditions if c.get("type") != CONDITION]
        conditions.append(
            {
                "type": CONDITION,
                "status": status,
                "reason": reason,
                "message": message,
                "lastTransitionTime": (old or {}).get("lastTransitionTime")
                if kept
                else now_rfc3339(),
                "observedGeneration": target.generation,
            }
        )
        if await self._call(
            f"Writing the Autoscaling condition of TritonModel {target.key}",
            self._kube.patch_model_status,
            target.namespace,
            target.name,
            target.uid,
            {"conditions": conditions},
        ):
            self._written[target.uid] = (wanted, self._monotonic())


def _held(room: list[tuple[str, list[Source]]], counts: Mapping[str, Counts]) -> Readings:
    """The held seconds of each model read for room, by source (none from a proxy not read)."""
    readings: dict[str, dict[str, float]] = {}
    for uid, sources in room:
        found = readings[uid] = {}
        for source, address, model in sources:
            entry = (counts.get(address) or {}).get(model)
            if entry is not None:
                found[source] = float(entry[0])
    return readings


async def read_counts(session: aiohttp.ClientSession, base: str) -> Counts:
    """A proxy's counts at `base`; {} when it does not answer in time or answers more than
    MAX_ANSWER_BYTES, and only well-formed entries (a tenant's pod may answer anything: it costs
    the binder no more)."""
    url = f"{base}{PROXY_AUTOSCALING_PATH}"
    try:
        async with session.get(url) as response:
            data = await response.content.read(MAX_ANSWER_BYTES + 1)
            if response.status != 200 or len(data) > MAX_ANSWER_BYTES:
                return {}
            body = json.loads(data)
    except (aiohttp.ClientError, TimeoutError, ValueError) as e:
        log.debug("Reading the counts of %s has failed (%s).", url, e)
        return {}
    if not isinstance(body, dict):
        return {}
    return {
        str(model): entry
        for model, entry in body.items()
        if isinstance(entry, list)
        and len(entry) == 2
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in entry)
    }


async def _first(*waits: Any) -> None:
    """Wait until the first of the awaitables is done; cancel the others."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
