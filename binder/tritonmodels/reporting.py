"""What a TritonModel's turn tells: its status, through the status writer
(`binder.tritonmodels.status`), and its Events.

The status: `placements[]` ({replica, node, gpu, proof, host, ready, message, storageUri}),
`nominations[]` (the rooms held for its replicas' preemptions, only while there are some),
`replicas`, `readyReplicas` (and `availableReplicas`), `updatedReplicas`, `selector`,
`observedGeneration`, `loadedStorageUri` (the files a replica was last ready with) and
`failedStorageUri` (files that failed to load before any replica of them was ready),
`gpuMemory` (how its next replica is booked, and what its files measured:
`binder.cluster.modelsizes`), and the
conditions of `binder.tritonmodels.status.CONDITIONS` this turn owns: `Placed` (False with
kube-scheduler's refusal, and a `FailedScheduling` Event only when the refusal changes), `Ready`
(False naming the replicas not served and why; not True while `Loaded` is not), `Progressing`
(the roll) and `Loaded`. Events: `Scheduled` (Normal) naming the node and GPU of each replica a
turn places; once per cause: `ReplicaNotServed` per replica and reason the agent gives (per
message for a host's loader failing to load it: its reason, FetchFailed, ModelInvalid..., is then
Ready's), `Preempted` and `Preempting`, and the roll's Warnings. Decides no placement; writes only
through `binder.api.kube`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from typing import Any

from binder.api.kube import Kube
from binder.cluster.modelsizes import DECLARED, Sizing, size_status
from binder.cluster.modelviews import ModelInfo, event_object
from binder.cluster.objects import NodeInfo, PodInfo
from binder.framework.moves import PREEMPTED, PREEMPTING
from binder.framework.replicapreemption import ReplicaPreemption
from binder.tritonmodels.placer import Outcome
from binder.tritonmodels.rolling import ROLLING_WITHOUT_SURGE, Roll, Rollout
from binder.tritonmodels.serving import HOST_REFUSED, Serving
from binder.tritonmodels.status import (
    CONDITIONS,
    LOADED,
    PLACED,
    PROGRESSING,
    READY,
    StatusWriter,
    Write,
)
from common.conditions import Condition, find
from common.contract import Keys
from common.hosted import LOAD_FAILURE_REASONS, host_name, serves_label
from common.kubeapi.session import JsonObject

NOT_SERVED_EVENT = "ReplicaNotServed"
"""The Warning Event's reason when the agent reports a replica not loaded on its host."""
QUIET_REASONS = frozenset({"ModelPending", "ModelDrained"})
"""The agent's reasons of a replica on its way in or out: no fault, no Event (as on the host)."""
READY_REASONS_SHOWN = 3
"""Not-ready replicas the Ready condition's message names (then how many more)."""
SCHEDULED_EVENT = "Scheduled"
"""The Normal Event's reason when a turn places replicas, kube-scheduler's for a pod bound."""
SCHEDULED_SHOWN = 10
"""Replicas a `Scheduled` Event names (then how many more)."""


class Reporter:
    """Tells each model's status and Events; the status written off the turns."""

    def __init__(
        self,
        kube: Kube,
        executor: Executor,
        *,
        identity: str,
        keys: Keys,
        leading: asyncio.Event,
        serving: Serving,
        rollout: Rollout,
        preemption: ReplicaPreemption,
        retry: Callable[[str], None],
        nodes: Mapping[str, NodeInfo],
        sizing: Sizing,
    ) -> None:
        """`serving`, `rollout` and `preemption` are read: whether each replica is served, its
        files, the rooms held; `retry(uid)`: a write failed, the model is reconciled again;
        `nodes`: the cluster's nodes as the cache has them (what their agents measured);
        `sizing`: how a model that declares no GPU memory is booked."""
        self._kube = kube
        self._executor = executor
        self._identity = identity
        self._keys = keys
        self._serving = serving
        self._rollout = rollout
        self._preemption = preemption
        self._retry = retry
        self._nodes = nodes
        self._sizing = sizing
        self._writes = StatusWriter(
            kube, executor, identity, leading=leading, on_failed=self._write_failed
        )
        """The models' status writes and refusal Events, off the turns."""
        self._refused: dict[str, str] = {}
        """Model uid -> the refusal last reported (an Event only when it changes)."""
        self._reported: dict[str, str] = {}
        """Replica uid -> the agent's reason for not serving it last reported in an Event."""
        self._roll_said: dict[str, str] = {}
        """Model uid -> the roll's Warning last recorded as an Event (one per message)."""
        self._assigned: dict[str, tuple[str, str]] = {}
        """Replica uid -> (node, GPU uuid) last told in a `Scheduled` Event, or found in the
        model's status (a new leader tells only what it places)."""

    @property
    def writer(self) -> StatusWriter:
        """The one writer of the models' status (the autoscaler hands it its verdicts)."""
        return self._writes

    async def run_writes(self, stop: asyncio.Event) -> None:
        """The models' status writes and refusal Events, off the turns, until `stop`."""
        await self._writes.run(stop)

    def forget(self, uid: str) -> None:
        """The model is gone: nothing more of it is written."""
        self._refused.pop(uid, None)
        self._writes.forget(uid)
        for rid in [r for r in self._reported if r.rpartition("/")[0] == uid]:
            del self._reported[rid]
        self._roll_said.pop(uid, None)
        for rid in [r for r in self._assigned if r.rpartition("/")[0] == uid]:
            del self._assigned[rid]

    def _write_failed(self, uid: str, event_owed: bool) -> None:
        """A status or Event write failed: the model is reconciled again, with its Event when
        that was not written (one written is not repeated: a refusal counts once)."""
        if event_owed:
            self._refused.pop(uid, None)
        self._retry(uid)

    def status(self, model: ModelInfo, outcome: Outcome) -> None:
        """The model's status after its turn, handed to the writer when it changed, with the
        refusal's Event when the refusal is new."""
        uid, refusal = model.uid, outcome.refusal
        status, said = self._status(model, outcome)
        current = model.status.get("conditions") or []
        changed = any(model.status.get(k) != v for k, v in status.items())
        changed = changed or CONDITIONS.compose(current, said) != current
        new_refusal = refusal if refusal and self._refused.get(uid) != refusal else ""
        if changed or new_refusal:
            write = Write(event_object(model), status if changed else None, new_refusal)
            write.said, write.current = dict(said), list(current)
            self._writes.put(write)
        if refusal:
            self._refused[uid] = refusal
        else:
            self._refused.pop(uid, None)

    async def events(self, model: ModelInfo, outcome: Outcome) -> None:
        """The Events of the model's turn: its replicas not served, preempted, and its roll."""
        await self._scheduled(model, outcome.placed)
        await self._not_served(model, outcome.placed)
        for why in self._preemption.unwritten(model.uid):
            await self._event(model, PREEMPTED, why, "Normal")
        await self._roll(model, outcome.roll)

    async def _scheduled(self, model: ModelInfo, placed: dict[int, PodInfo]) -> None:
        """A Normal `Scheduled` Event on the model naming each replica placed since the last
        one, with its node and GPU (as kube-scheduler's "Successfully assigned ns/pod to
        node"): one Event a turn, however many it placed. A replica the model's status already
        lists where it is was placed before (by this binder or an earlier leader): not told."""
        listed = {
            (entry.get("replica"), entry.get("node"), entry.get("gpu"))
            for entry in model.status.get("placements") or ()
            if isinstance(entry, Mapping)
        }
        told: list[tuple[int, str]] = []
        for ordinal, replica in sorted(placed.items()):
            where = (replica.node_name, replica.gpu_uuid)
            if self._assigned.get(replica.uid) == where:
                continue
            self._assigned[replica.uid] = where
            if (ordinal, *where) not in listed:
                told.append((ordinal, self._gpu_named(*where)))
        if not told:
            return
        key = f"{model.namespace}/{model.name}"
        if len(told) == 1:
            ordinal, gpu = told[0]
            message = f"Successfully assigned replica {ordinal} of {key} to {gpu}"
        else:
            shown = [f"{ordinal} to {gpu}" for ordinal, gpu in told[:SCHEDULED_SHOWN]]
            more = f"; {len(told) - len(shown)} more" if len(told) > len(shown) else ""
            message = f"Successfully assigned replicas of {key}: {'; '.join(shown)}{more}"
        await self._event(model, SCHEDULED_EVENT, message, "Normal")

    def _gpu_named(self, node: str, uuid: str) -> str:
        """`node, GPU i (uuid)`, as the pods' Scheduled Events name a GPU."""
        info = self._nodes.get(node)
        index = next((g.index for g in info.gpus if g.uuid == uuid), None) if info else None
        return f"{node}, GPU {index if index is not None else '?'} ({uuid})"

    async def _not_served(self, model: ModelInfo, placed: dict[int, PodInfo]) -> None:
        """A Warning Event on the model per replica and reason the agent gives for not serving
        it (once each, as the agent reports a model pod's)."""
        for ordinal, replica in sorted(placed.items()):
            loaded = self._serving.loaded(model, replica)
            if loaded.reason in ("", HOST_REFUSED):  # the refusal has its own Event
                self._reported.pop(replica.uid, None)
                continue
            if loaded.reason in QUIET_REASONS:
                continue  # no fault; the cause said last is not said again when it comes back
            # A host's loader's failures are told apart by cause (a 404, then a credential
            # refused); the agent's other reasons by reason (its messages carry counts).
            said = loaded.why if loaded.reason in LOAD_FAILURE_REASONS else loaded.reason
            if self._reported.get(replica.uid) == said:
                continue
            message = f"replica {ordinal} on node {replica.node_name}: {loaded.why}"
            await self._event(model, NOT_SERVED_EVENT, message)
            self._reported[replica.uid] = said

    async def preempting(
        self, model: ModelInfo, ordinal: int, node: str, victims: list[str]
    ) -> None:
        """The `Preempting` Event on a preemptor whose victims were evicted or drained."""
        message = (
            f"replica {ordinal}: preempting {len(victims)} lower-priority pod(s) and replica(s) "
            f"on node {node}: {', '.join(victims)}"
        )
        await self._event(model, PREEMPTING, message, "Normal")

    async def _roll(self, model: ModelInfo, roll: Roll) -> None:
        """A Warning Event on the model when its roll goes on without a surge replica, or
        stalls on new files a replica does not serve (once per message)."""
        if roll.fallback:
            said = (ROLLING_WITHOUT_SURGE, roll.fallback)
        elif roll.status == "False":
            said = (roll.reason, roll.message)
        else:
            self._roll_said.pop(model.uid, None)
            return
        if self._roll_said.get(model.uid) == said[1]:
            return
        await self._event(model, said[0], said[1])
        self._roll_said[model.uid] = said[1]

    def _status(
        self, model: ModelInfo, outcome: Outcome
    ) -> tuple[JsonObject, dict[str, Condition | None]]:
        """The model's status fields (all but its conditions) and the conditions its turn
        says."""
        placed, refusal, waiting, roll = (
            outcome.placed,
            outcome.refusal,
            outcome.waiting,
            outcome.roll,
        )
        reason = outcome.reason
        generation = model.generation
        if refusal:
            placed_said = Condition(PLACED, "False", reason, refusal, generation)
        elif waiting:
            why = reason if reason == PREEMPTED else "ReplicaDraining"
            placed_said = Condition(PLACED, "False", why, waiting, generation)
        else:
            message = f"{min(len(placed), model.replicas)} of {model.replicas} replicas placed"
            placed_said = Condition(PLACED, "True", "AllReplicasPlaced", message, generation)
        placements = []
        why_not: list[str] = []
        not_ready = "ReplicasNotReady"
        files = _Files(model)
        for ordinal, replica in sorted(placed.items()):
            ready, why, agent_reason = self._serving.served(model, replica)
            uri = self._rollout.uri(model, ordinal)
            where = f"replica {ordinal} on {replica.node_name}"
            files.replica(uri, ready, agent_reason, f"{where}: {why}")
            if agent_reason == HOST_REFUSED:
                not_ready = HOST_REFUSED
            elif agent_reason in LOAD_FAILURE_REASONS and not_ready == "ReplicasNotReady":
                not_ready = agent_reason  # the first replica's, by ordinal
            entry: dict[str, Any] = {
                "replica": ordinal,
                "node": replica.node_name,
                "gpu": replica.gpu_uuid,
                "proof": replica.placement,
                "host": host_name(replica.node_name, model.storage_secret),
                "ready": ready,
                "storageUri": uri,
            }
            if why:
                entry["message"] = why
                why_not.append(f"replica {ordinal} on {replica.node_name}: {why}")
            placements.append(entry)
        ready_count = len(placements) - len(why_not)
        message = f"{min(ready_count, model.replicas)} of {model.replicas} replicas ready"
        if len(placed) < model.replicas:
            why_not.append(f"{model.replicas - len(placed)} not placed (see {PLACED})")
        if why_not and ready_count < model.replicas:
            shown = why_not[:READY_REASONS_SHOWN]
            if len(why_not) > len(shown):
                shown.append(f"{len(why_not) - len(shown)} more")
            own = Condition(READY, "False", not_ready, f"{message}; {'; '.join(shown)}")
        else:
            own = Condition(READY, "True", "AllReplicasReady", message)
        own = Condition(own.type, own.status, own.reason, own.message, generation)
        loaded = files.condition(generation)
        status: JsonObject = {
            "observedGeneration": generation,
            "replicas": len(placed),
            "readyReplicas": ready_count,
            "availableReplicas": ready_count,
            "updatedReplicas": roll.updated,
            "selector": f"{serves_label(self._keys, model.name)}=true",
            "placements": placements,
            # A merge patch's null removes a field.
            "loadedStorageUri": files.loaded or None,
            "failedStorageUri": files.failed or None,
        }
        status["gpuMemory"] = self._size(model, placed)
        nominations = self._preemption.nominations(model.uid)
        if nominations or model.status.get("nominations"):
            status["nominations"] = nominations or None
        progressing = Condition(PROGRESSING, roll.status, roll.reason, roll.message, generation)
        said: dict[str, Condition | None] = {
            PLACED: placed_said,
            READY: CONDITIONS.happy_of(own, {LOADED: loaded}),
            PROGRESSING: progressing,
            LOADED: loaded,
        }
        return status, said

    def _size(self, model: ModelInfo, placed: dict[int, PodInfo]) -> JsonObject:
        """status.gpuMemory (`binder.cluster.modelsizes`): the largest figure the agents publish
        for the model's replicas of its current files."""
        figures = []
        for ordinal, replica in placed.items():
            node = self._nodes.get(replica.node_name)
            if node is None or self._rollout.uri(model, ordinal) != model.storage_uri:
                continue
            figure = node.measured_of(replica)
            if figure is not None:
                figures.append(figure)
        declared = model.gpu_memory if model.size_source == DECLARED else None
        measured = max(figures, default=None)
        sized = size_status(declared, model.storage_uri, model.status, measured, self._sizing)
        # A merge patch keeps the fields it does not name: a null removes one no longer said.
        old = model.status.get("gpuMemory")
        gone = {k: None for k in old if k not in sized} if isinstance(old, Mapping) else {}
        return {**gone, **sized}

    async def _event(
        self, model: ModelInfo, reason: str, message: str, event_type: str = "Warning"
    ) -> None:
        involved = event_object(model)
        await asyncio.get_running_loop().run_in_executor(
            self._executor,
            lambda: self._kube.record_object_event(
                involved,
                reason=reason,
                message=message,
                reporting_instance=self._identity,
                event_type=event_type,
            ),
        )


class _Files:
    """Whether the model's current files (spec.storageUri) have loaded: the `Loaded`
    condition. True once a replica of them has been ready (remembered in
    `status.loadedStorageUri`, so it holds at zero replicas), or while any replica is ready (a
    roll's old files serve); False with the load's failure while none of them has been ready
    (remembered in `status.failedStorageUri`); Unknown before either."""

    def __init__(self, model: ModelInfo) -> None:
        self.current = model.storage_uri
        status = model.status
        self.loaded = str(status.get("loadedStorageUri") or "")
        self.failed = str(status.get("failedStorageUri") or "")
        self._old = find(status.get("conditions"), LOADED)
        self._serving = False
        self._failure: tuple[str, str] | None = None
        """(reason, message) of the current files' failure to load."""

    def replica(self, uri: str, ready: bool, agent_reason: str, said: str) -> None:
        """One replica of `uri`: `ready`, or not for `agent_reason`, as `said` (its host's
        word)."""
        if ready:
            self._serving = True
            if uri == self.current:
                self.loaded = uri
            return
        failed = uri == self.current and agent_reason in LOAD_FAILURE_REASONS
        if failed and self._failure is None:
            self._failure = (agent_reason, f"no replica of {uri} has been ready: {said}")

    def condition(self, generation: int) -> Condition:
        current = self.current
        if self.loaded == current:
            self.failed = ""
            return Condition(
                LOADED, "True", "FilesLoaded", f"a replica of {current} has been ready", generation
            )
        old = self._old
        kept = old is not None and old.get("status") == "False" and self.failed == current
        if self._failure is None and old is not None and kept:
            # Said while a replica failed: kept at zero replicas, until one loads.
            self._failure = (str(old.get("reason")), str(old.get("message")))
        if self._failure is not None:
            self.failed = current
        else:
            self.failed = ""
        if self._serving:
            return Condition(
                LOADED,
                "True",
                "ReplicasServing",
                f"replicas of earlier files serve; no replica of {current} has been ready yet",
                generation,
            )
        if self._failure is not None:
            reason, message = self._failure
            return Condition(LOADED, "False", reason, message, generation)
        return Condition(
            LOADED,
            "Unknown",
            "NotLoadedYet",
            f"no replica of {current} has been ready yet",
            generation,
        )
