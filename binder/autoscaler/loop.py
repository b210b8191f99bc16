"""The built-in autoscaler's loop: reads the proxies' counts once a `period`, decides with
`binder.autoscaler.kpa` (Knative's KPA) and writes each target's replicas through its `scale`
subresource, on the leader only. Targets (`binder.autoscaler.targets`): TritonModels with
spec.autoscaling, and Deployments of model pods with `autoscaling.knative.dev/target` (never
below one pod).

Where the counts come from: every proxy (a model host's, a model pod's) serves, on its metrics
port, the cumulative held request-seconds and answered requests of each model it serves
(`/autoscaling`, a few bytes a model). Each tick the loop asks every proxy of a scaled target
once, all side by side, with a timeout under the period: one request per pod per period however
many models a host serves, and O(1) work a model to decide. The proxy counts queued requests too,
as Knative's queue-proxy does, which the node gateway (past the queue) would not see. Addresses
come from the binder's pod watch (the ledger's hosts; model pods through `Index.apply_pod`); no
Prometheus in between. The same read serves awake first (`binder.autoscaler.room`): the hosts of
every on-demand TritonModel with replicas to spare and a capacity are read too, and their held
seconds handed to the model controller (`on_load`), so one request per host a period serves both.

One owner of `scale` at a time: an object an autoscaling/v2 HorizontalPodAutoscaler targets
(KEDA's ScaledObject makes one) is left to it. A TritonModel's `Autoscaling` condition says who
scales it (reason `BuiltIn`, `HorizontalPodAutoscaler`, `KEDAScaledObject` or `InvalidSettings`):
the loop hands that verdict to the model's one status writer (`verdicts`), which writes it with
the model's other conditions; a Deployment's status is its controller's, so it gets an Event with
that reason when it changes.
Until the HPAs and Deployments have been listed the loop scales nothing. Its windows start afresh
when this replica begins to lead; a follower decides nothing, and a write stops being retried once
leadership is lost (`Session.retrying`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import Executor
from functools import partial
from typing import Any

import aiohttp

from binder.api.inbox import Inbox
from binder.api.informer import Informer
from binder.api.kube import Kube
from binder.api.listwatch import DEPLOYMENTS, HORIZONTAL_POD_AUTOSCALERS
from binder.autoscaler.kpa import Decider, Decision, Scaling
from binder.autoscaler.loadcounts import Counts, answer_bound, parse_counts
from binder.autoscaler.parkedmodels import parked_on
from binder.autoscaler.room import needs_room
from binder.autoscaler.targets import (
    INVALID_SETTINGS,
    NOT_MODEL_PODS,
    Index,
    Target,
    host_sources,
    model_target,
)
from binder.cluster.ledger import Ledger
from binder.cluster.modelviews import event_object
from common.contract import PROXY_AUTOSCALING_PATH, Keys
from common.hosted import group_namespace

log = logging.getLogger(__name__)

DEFAULT_KEYS = Keys()

WARNINGS = frozenset({INVALID_SETTINGS, NOT_MODEL_PODS})
"""Reasons a Deployment's Event is a Warning for."""
GROUPS = {
    "TritonModel": ("tritonshare.io", "v1alpha1", "tritonmodels"),
    "Deployment": ("apps", "v1", "deployments"),
}
Source = tuple[str, str, str]
"""(source, address, model): `Target.sources`."""
Readings = Mapping[str, Mapping[str, float]]
"""Model uid -> source (node) -> the seconds its requests were held there (cumulative)."""
Report = tuple[str, str, str]
"""(status, reason, message) of who scales a target."""
Verdicts = Callable[[dict[str, Any], Any, Report | None, int], bool]
"""The model status writer's `autoscaling(involved, its conditions as cached, verdict (None: not
scaled by the autoscaler), generation)`: whether a write was queued."""
MAX_ANSWER_BYTES = 4 << 20
"""The most of one proxy's /autoscaling answer read: a host of 10,000 models with ids of 128
characters answers at most 1.9 MiB. A pod's own bound is smaller: `answer_bound` of the models
it serves."""
PARALLEL_READS = 64
"""Proxies read at once, all namespaces together."""
PARALLEL_READS_PER_NAMESPACE = 8
"""Proxies of one namespace read at once: a namespace of slow pods holds no more of the reads."""
WRITES_PER_NAMESPACE = 8
"""Condition and Event writes saying who scales a target, at most, for one namespace in a tick;
the rest wait for the next ticks (a namespace of many Deployments takes its turns)."""
YIELD_EVERY = 100
"""Targets handled between two yields to the binder's loop (placement, /healthz)."""
MAX_SOURCES_EXTRA = 5
"""A Deployment's pods read beyond its replicas (a roll's surge): more pods matching its selector,
which its namespace could create, cost the binder no more reads."""


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
        verdicts: Verdicts,
        on_load: Callable[[float, Readings], None],
        keys: Keys = DEFAULT_KEYS,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kube = kube
        self._verdicts = verdicts
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
        """Told each tick the held seconds of the models `binder.autoscaler.room` reads."""
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
            (HORIZONTAL_POD_AUTOSCALERS, index.replace_hpas, index.apply_hpa),
            (DEPLOYMENTS, index.replace_deployments, index.apply_deployment),
        ):
            informer = Informer(
                self._kube, kind, loop, on_list=on_list, on_event=on_event, inbox=self._inbox
            )
            informer.start()
            self.informers.append(informer)
        timeout = aiohttp.ClientTimeout(total=self.read_timeout)
        connector = aiohttp.TCPConnector(limit=PARALLEL_READS)
        try:
            async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
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
            if (target := model_target(model, hosts.get(model.host_group) or {}, self._keys))
            is not None
        ]
        return [*found, *self.index.deployment_targets(self._ledger.state.is_accounted)]

    async def tick(self, session: aiohttp.ClientSession) -> None:
        """One read of the proxies, one decision and at most one write per scaled target.

        Its cost is bounded by what runs, not by what a namespace writes: each proxy is read
        once, at most `answer_bound` bytes for the models it serves, and each target sums only
        its own sources' entries; a namespace's reads and writes take turns with the others',
        one target's failure is that target's alone, and the loop yields every `YIELD_EVERY`
        targets."""
        if len(self.index.listed) < 2:
            return
        scaled: list[tuple[Target, Scaling]] = []
        targets = self.targets()
        await self._clear_stale()
        writes: Counter[str] = Counter()
        for turn, target in enumerate(targets):
            if turn % YIELD_EVERY == YIELD_EVERY - 1:
                await asyncio.sleep(0)
            owner = self.index.owner(
                target.namespace, GROUPS[target.kind][0], target.kind, target.name
            )
            if owner is not None:
                reason, message = owner
                wanted = ("False", reason, f"{message}: the built-in autoscaler leaves it alone")
            elif target.scaling is None:
                wanted = ("False", target.reason, target.problem)
            else:
                note = f"; {target.note}" if target.note else ""
                wanted = ("True", "BuiltIn", describe(target.scaling) + note)
                scaled.append((target, target.scaling))
            await self._report(target, wanted, writes)
        self._forget({target.uid for target, _ in scaled}, {t.uid for t in targets})
        hosts = self._ledger.hosts
        room = [
            (model.uid, model.namespace, list(host_sources(model, hosts.get(model.host_group, {}))))
            for model in list(self._ledger.models.values())
            if needs_room(model)
        ]
        counts = await self._read_all(session, self._reads_for(scaled, room))
        now = self._monotonic()
        if self._leading.is_set():
            self._on_load(now, _held(room, counts))
        for turn, (target, scaling) in enumerate(scaled):
            if turn % YIELD_EVERY == YIELD_EVERY - 1:
                await asyncio.sleep(0)
            try:
                await self._decide(target, scaling, counts, now)
            except Exception:
                log.exception(
                    "Deciding the scale of %s %s has failed: its replicas stay as they are "
                    "this period.",
                    target.kind,
                    target.key,
                )

    def _reads_for(
        self, scaled: list[tuple[Target, Scaling]], room: list[tuple[str, str, list[Source]]]
    ) -> dict[str, tuple[str, int]]:
        """Address -> (namespace, the most bytes read of its answer) of each proxy to read: a
        model pod answers for one model, a host for the models of its namespace placed or
        parked on its node."""
        served: Counter[tuple[str, str]] = Counter()
        for model in list(self._ledger.models.values()):
            for node in {node for node, _, _ in model.placed.values()}:
                served[model.namespace, node] += 1
        for group, nodes in self._ledger.hosts.items():
            for node, host in nodes.items():
                served[group_namespace(group), node] += len(parked_on(host, self._keys))
        reads: dict[str, tuple[str, int]] = {}
        for target, _ in scaled:
            for source, address, _ in target.sources[
                : max(target.replicas, target.ready) + MAX_SOURCES_EXTRA
            ]:
                models = 1 if target.kind == "Deployment" else served[target.namespace, source]
                reads[address] = (target.namespace, answer_bound(models, MAX_ANSWER_BYTES))
        for _, namespace, sources in room:
            for node, address, _ in sources:
                models = served[namespace, node]
                reads[address] = (namespace, answer_bound(models, MAX_ANSWER_BYTES))
        return reads

    async def _read_all(
        self, session: aiohttp.ClientSession, reads: Mapping[str, tuple[str, int]]
    ) -> dict[str, Counts]:
        """Every proxy of `reads` read side by side, each namespace's at most
        PARALLEL_READS_PER_NAMESPACE at once, all within the read timeout: a proxy not read by
        then gives no counters this period (its namespace's slow pods cost the others
        nothing)."""
        if not reads:
            return {}
        turns: dict[str, asyncio.Semaphore] = {}

        async def read(address: str, namespace: str, bound: int) -> Counts:
            turn = turns.setdefault(namespace, asyncio.Semaphore(PARALLEL_READS_PER_NAMESPACE))
            async with turn, self._reads:
                return await read_counts(session, f"http://{address}:{self._port}", bound)

        tasks = {
            address: asyncio.ensure_future(read(address, namespace, bound))
            for address, (namespace, bound) in sorted(reads.items())
        }
        done, late = await asyncio.wait(tasks.values(), timeout=self.read_timeout)
        for task in late:
            task.cancel()
        if late:
            await asyncio.wait(late)
        return {
            address: task.result()
            for address, task in tasks.items()
            if task in done and task.exception() is None
        }

    @property
    def read_timeout(self) -> float:
        """How long a tick's reads take at most (one read's too)."""
        return max(0.2, self.period * 0.8)

    async def _decide(
        self, target: Target, scaling: Scaling, counts: Mapping[str, Counts], now: float
    ) -> None:
        column = 0 if scaling.metric == "concurrency" else 1
        counters: dict[str, float] = {}
        for source, address, model in target.sources:
            entry = (counts.get(address) or {}).get(model)  # one not read: no counters from it
            if entry is not None:
                counters[source] = counters.get(source, 0.0) + entry[column]
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
        """The verdict on a TritonModel whose spec.autoscaling is gone: none (its condition
        goes; the writer writes only where the cache still shows one)."""
        for model in list(self._ledger.models.values()):
            if model.autoscaling is None and model.status.get("conditions"):
                self._verdicts(
                    event_object(model), model.status.get("conditions"), None, model.generation
                )

    async def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, partial(fn, *args, **kwargs))
        except Exception as e:
            log.warning("%s has failed (%s).", what, e)
            return False
        return True

    def _event(self, target: Target, reason: str, message: str, kind: str) -> Awaitable[bool]:
        involved = _involved(target)
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

    async def _report(self, target: Target, wanted: Report, writes: Counter[str]) -> None:
        """Say who scales the target: a TritonModel's condition, a Deployment's Event; written
        only when it changes, at most WRITES_PER_NAMESPACE of a namespace a tick (`writes`
        counts them)."""
        if not self._leading.is_set() or writes[target.namespace] >= WRITES_PER_NAMESPACE:
            return
        written = self._written.get(target.uid)
        if target.kind == "Deployment":
            if written is None or written[0] != wanted:
                writes[target.namespace] += 1
                status, reason, message = wanted
                kind = "Normal" if status == "True" or reason not in WARNINGS else "Warning"
                if await self._event(target, reason, message, kind):
                    self._written[target.uid] = (wanted, self._monotonic())
            return
        conditions = target.status.get("conditions")
        if self._verdicts(_involved(target), conditions, wanted, target.generation):
            writes[target.namespace] += 1


def _involved(target: Target) -> dict[str, Any]:
    """`target` as an Event's involvedObject, or the object a status verdict is on."""
    group, version, _ = GROUPS[target.kind]
    return {
        "apiVersion": f"{group}/{version}",
        "kind": target.kind,
        "namespace": target.namespace,
        "name": target.name,
        "uid": target.uid,
    }


def _held(room: list[tuple[str, str, list[Source]]], counts: Mapping[str, Counts]) -> Readings:
    """The held seconds of each model read for room, by source (none from a proxy not read)."""
    readings: dict[str, dict[str, float]] = {}
    for uid, _, sources in room:
        found = readings[uid] = {}
        for source, address, model in sources:
            entry = (counts.get(address) or {}).get(model)
            if entry is not None:
                found[source] = entry[0]
    return readings


async def read_counts(
    session: aiohttp.ClientSession, base: str, bound: int = MAX_ANSWER_BYTES
) -> Counts:
    """A proxy's counts at `base`: its whole answer, read up to `bound` bytes, then only its
    well-formed entries (`binder.autoscaler.loadcounts`); {} when it does not answer in time, fails
    in any way or answers more (a tenant's pod may answer anything: it costs the binder no more)."""
    url = f"{base}{PROXY_AUTOSCALING_PATH}"
    try:
        async with session.get(url) as response:
            if response.status != 200:
                return {}
            data = bytearray()
            while len(data) <= bound:
                chunk = await response.content.read(bound + 1 - len(data))
                if not chunk:
                    break
                data += chunk
            if len(data) > bound:
                log.debug("%s answered more than %d bytes: its counts are not read.", url, bound)
                return {}
    except Exception as e:
        log.debug("Reading the counts of %s has failed (%s).", url, e)
        return {}
    return parse_counts(bytes(data))


async def _first(*waits: Any) -> None:
    """Wait until the first of the awaitables is done; cancel the others."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
