"""The built-in autoscaler's loop: reads the proxies' counts once a `period`, decides with
`binder.autoscaler` (Knative's KPA) and writes each TritonModel's replicas through its `scale`
subresource, on the leader only.

Where the counts come from: every model host's proxy serves, on its metrics port, the cumulative
held request-seconds and answered requests of each model it hosts (`/autoscaling`, a few bytes a
model). Each tick the loop asks every host that holds a replica of an autoscaled TritonModel once,
all hosts side by side, with a timeout under the period: one request per host per period however
many models it hosts, and the decision is O(1) a model. The proxy counts queued requests too, as
Knative's queue-proxy does, which the node gateway (past the queue) would not see. Pod addresses
come from the binder's own pod watch (the ledger's hosts); no Prometheus in between.

One owner of `scale` at a time: a TritonModel that an autoscaling/v2 HorizontalPodAutoscaler
targets (KEDA's ScaledObject makes one) is left to it, and its `Autoscaling` condition says which
(reason `HorizontalPodAutoscaler` or `KEDAScaledObject`). Until the HPA list has been read the loop
scales nothing. Its windows start afresh when this replica begins to lead; a follower decides
nothing, and a write stops being retried once leadership is lost (`Kube._write`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from functools import partial
from typing import Any

import aiohttp

from binder.autoscaler import Decider, Decision, Scaling, ScalingError, scaling_from
from binder.cache import Informer, Ledger
from binder.inbox import Inbox
from binder.kube import JsonObject, Kube, now_rfc3339
from binder.model import ModelInfo
from common.contract import PROXY_AUTOSCALING_PATH

log = logging.getLogger(__name__)

CONDITION = "Autoscaling"
KEDA_LABEL = "scaledobject.keda.sh/name"
TRITONMODEL = ("tritonshare.io", "TritonModel")
Counts = Mapping[str, list[float]]
REWRITE_SECONDS = 5.0
"""A condition written that the cache does not show after this long is written again (the
model controller's status write may have replaced the list meanwhile)."""


def hpa_owner(hpa: JsonObject) -> tuple[tuple[str, str, str, str], str, str] | None:
    """((namespace, API group, kind, name) of the HPA's target, reason, message); None for an
    HPA without a target."""
    meta, spec = hpa.get("metadata") or {}, hpa.get("spec") or {}
    target = spec.get("scaleTargetRef") or {}
    if not target.get("name") or not target.get("kind"):
        return None
    group = str(target.get("apiVersion") or "").rpartition("/")[0]
    key = (str(meta.get("namespace", "")), group, str(target["kind"]), str(target["name"]))
    scaled_object = (meta.get("labels") or {}).get(KEDA_LABEL)
    if scaled_object:
        return key, "KEDAScaledObject", f"KEDA ScaledObject {scaled_object} scales it"
    return key, "HorizontalPodAutoscaler", f"HorizontalPodAutoscaler {meta.get('name')} scales it"


def describe(scaling: Scaling) -> str:
    top = scaling.max_replicas or "no limit"
    return (
        f"the built-in autoscaler scales on {scaling.metric}, target {scaling.target:g} per "
        f"replica at {scaling.utilization * 100:g} %, {scaling.min_replicas} to {top} "
        f"replicas, stable window {scaling.window:g} s, panic window "
        f"{scaling.panic_window:g} s at {scaling.panic_threshold_percentage:g} %"
    )


class Autoscaling:
    """The loop, its HPA cache and one `Decider` per autoscaled TritonModel."""

    def __init__(
        self,
        kube: Kube,
        ledger: Ledger,
        *,
        leading: asyncio.Event,
        executor: Executor,
        inbox: Inbox,
        period: float,
        port: int,
        identity: str,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kube = kube
        self._ledger = ledger
        self._leading = leading
        self._executor = executor
        self._inbox = inbox
        self.period = period
        self._port = port
        self._identity = identity
        self._monotonic = monotonic
        self._owners: dict[tuple[str, str, str, str], tuple[str, str]] = {}
        self._by_hpa: dict[str, tuple[str, str, str, str]] = {}
        self._deciders: dict[str, Decider] = {}
        self._asked: dict[str, tuple[int, int]] = {}
        """Model uid -> (replicas last asked, the generation then), until the cache shows it."""
        self._written: dict[str, tuple[tuple[str, str, str] | None, float]] = {}
        """Model uid -> (the condition last written, when), until the cache shows it."""
        self._hpas_listed = False
        self.informer: Informer | None = None

    # ---- the HPAs, from their own informer -----------------------------------------------------

    def replace_hpas(self, items: list[JsonObject]) -> None:
        self._owners.clear()
        self._by_hpa.clear()
        for item in items:
            self.apply_hpa("ADDED", item)
        self._hpas_listed = True

    def apply_hpa(self, event: str, obj: JsonObject) -> None:
        uid = str((obj.get("metadata") or {}).get("uid", ""))
        old = self._by_hpa.pop(uid, None)
        if old is not None:
            self._owners.pop(old, None)
        found = hpa_owner(obj)
        if event != "DELETED" and found is not None:
            key, reason, message = found
            self._owners[key] = (reason, message)
            self._by_hpa[uid] = key

    def owner(self, model: ModelInfo) -> tuple[str, str] | None:
        return self._owners.get((model.namespace, *TRITONMODEL, model.name))

    # ---- the loop ------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        self.informer = Informer(
            self._kube,
            self._kube.horizontal_pod_autoscalers(),
            loop,
            on_list=self.replace_hpas,
            on_event=self.apply_hpa,
            inbox=self._inbox,
            optional=True,
        )
        self.informer.start()
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
            self.informer.stop()
            await loop.run_in_executor(self._executor, self.informer.join, 5.0)

    async def tick(self, session: aiohttp.ClientSession) -> None:
        """One read of the hosts, one decision and at most one write per autoscaled model."""
        if not self._hpas_listed:
            return
        scaled: list[tuple[ModelInfo, Scaling]] = []
        hosts: dict[tuple[str, str], str] = {}
        for model in list(self._ledger.models.values()):
            scaling = await self._settled(model)
            if scaling is None:
                self._deciders.pop(model.uid, None)
                continue
            scaled.append((model, scaling))
            for node, _, _ in model.placed.values():
                address = self._host_address(model.namespace, node)
                if address:
                    hosts[model.namespace, node] = address
        kept = {model.uid for model, _ in scaled}
        for memory in (self._deciders, self._asked):
            for uid in set(memory) - kept:
                del memory[uid]
        if not scaled:
            return
        keys = list(hosts)
        answers = await asyncio.gather(*(self._read(session, hosts[k]) for k in keys))
        counts = dict(zip(keys, answers, strict=True))
        now = self._monotonic()
        for model, scaling in scaled:
            column = 0 if scaling.metric == "concurrency" else 1
            counters: dict[str, float] = {}
            for node, _, _ in model.placed.values():
                entry = (counts.get((model.namespace, node)) or {}).get(model.name)
                if entry is not None:
                    counters[node] = float(entry[column])
            decider = self._deciders.setdefault(model.uid, Decider())
            decider.observe(now, counters, scaling)
            ready = model.status.get("readyReplicas")
            ready_count = ready if isinstance(ready, int) else 0
            current = model.replicas
            asked = self._asked.get(model.uid)
            if asked is not None:
                if model.generation > asked[1]:
                    del self._asked[model.uid]
                else:
                    current = asked[0]
            decision = decider.decide(now, scaling, ready_count, current)
            if decision.replicas != current and self._leading.is_set():
                await self._scale(model, current, scaling, decision)

    def _host_address(self, namespace: str, node: str) -> str:
        host = (self._ledger.hosts.get(namespace) or {}).get(node) or {}
        return str((host.get("status") or {}).get("podIP") or "")

    async def _read(self, session: aiohttp.ClientSession, address: str) -> Counts:
        url = f"http://{address}:{self._port}{PROXY_AUTOSCALING_PATH}"
        try:
            async with session.get(url) as response:
                if response.status != 200:
                    return {}
                body = json.loads(await response.read())
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            log.debug("Reading the counts of %s has failed (%s).", url, e)
            return {}
        return body if isinstance(body, dict) else {}

    async def _scale(
        self, model: ModelInfo, current: int, scaling: Scaling, decision: Decision
    ) -> None:
        mode = "panic" if decision.panicking else "stable"
        window = scaling.panic_window if decision.panicking else scaling.window
        observed = decision.panic if decision.panicking else decision.stable
        message = (
            f"New size: {decision.replicas}; reason: {scaling.metric} {observed:.2f} over the "
            f"{window:g} s {mode} window, target {scaling.target * scaling.utilization:g} per "
            "replica"
        )
        log.info("TritonModel %s scales from %d: %s", model.key, current, message)
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(
                self._executor,
                self._kube.scale_model,
                model.namespace,
                model.name,
                decision.replicas,
            )
        except Exception as e:
            log.warning("Scaling TritonModel %s has failed (%s): next period.", model.key, e)
            return
        # Until the cache sees the new spec.replicas (a new generation), it is the current one.
        self._asked[model.uid] = (decision.replicas, model.generation)
        involved = {
            "apiVersion": "tritonshare.io/v1alpha1",
            "kind": "TritonModel",
            "namespace": model.namespace,
            "name": model.name,
            "uid": model.uid,
        }
        try:
            await loop.run_in_executor(
                self._executor,
                partial(
                    self._kube.record_object_event,
                    involved,
                    reason="SuccessfulRescale",
                    message=message,
                    reporting_instance=self._identity,
                    event_type="Normal",
                ),
            )
        except Exception as e:
            log.warning("Recording the rescale of TritonModel %s has failed (%s).", model.key, e)

    async def _settled(self, model: ModelInfo) -> Scaling | None:
        """The model's settings when the built-in autoscaler owns its scale; else None, with
        its condition saying why (written only when it changes)."""
        raw = model.autoscaling
        if raw is None:
            await self._condition(model, None)
            return None
        owner = self.owner(model)
        if owner is not None:
            reason, message = owner
            await self._condition(
                model, ("False", reason, f"{message}: the built-in autoscaler leaves it alone")
            )
            return None
        try:
            scaling = scaling_from(raw)
        except ScalingError as e:
            await self._condition(model, ("False", "InvalidSettings", f"spec.autoscaling: {e}"))
            return None
        await self._condition(model, ("True", "BuiltIn", describe(scaling)))
        return scaling

    async def _condition(self, model: ModelInfo, wanted: tuple[str, str, str] | None) -> None:
        conditions = [c for c in model.status.get("conditions") or [] if isinstance(c, dict)]
        old = next((c for c in conditions if c.get("type") == CONDITION), None)
        if wanted is None and old is None:
            return
        written = self._written.get(model.uid)
        if (
            written is not None
            and written[0] == wanted
            and self._monotonic() - written[1] < REWRITE_SECONDS
        ):
            return  # written, and the cache has not seen it yet
        others = [c for c in conditions if c.get("type") != CONDITION]
        if wanted is not None:
            status, reason, message = wanted
            if old is not None and (old.get("status"), old.get("reason"), old.get("message")) == (
                status,
                reason,
                message,
            ):
                return
            changed = old is None or old.get("status") != status
            others.append(
                {
                    "type": CONDITION,
                    "status": status,
                    "reason": reason,
                    "message": message,
                    "lastTransitionTime": now_rfc3339()
                    if changed or old is None
                    else old.get("lastTransitionTime"),
                    "observedGeneration": model.generation,
                }
            )
        if not self._leading.is_set():
            return
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(
                self._executor,
                self._kube.patch_model_status,
                model.namespace,
                model.name,
                model.uid,
                {"conditions": others},
            )
        except Exception as e:
            log.warning(
                "Writing the Autoscaling condition of TritonModel %s has failed (%s).",
                model.key,
                e,
            )
            return
        self._written[model.uid] = (wanted, self._monotonic())


async def _first(*waits: Any) -> None:
    """Wait until the first of the awaitables is done; cancel the others."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
