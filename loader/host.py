"""A model host's loader: follows the host's replicas, as the agent lists them, until stopped.

Every poll asks the agent for the host's replicas (ListHosted) and, per replica (several of one
model may share the host, each with its own files, GPU and private name in Triton):

- a replica new here (or that failed, once its backoff is over): its files are fetched from its
  storage URI into ROOT/<model>.<ordinal> (loader/fetch.py: s3://, gs://, https://, with its
  storage Secret and s3-* settings: loader/credentials.py; kept while the URI stays the same, so a
  restarted loader fetches nothing again), then the SAME flow a model pod's loader runs
  (loading.py: GetModel, InstallKept or InstallModel, LoadModel, wait READY) with the model id =
  the replica's model, each call naming the replica's ordinal; at most `parallel` at once, in
  the host's slots (loader/slots.py: a model holds one at most, models retrying after a failure
  `parallel - 1` at most). A fetch ends at its deadline (`HostTiming.fetch_seconds`), its slot
  free at once. A failure is logged with its reason and retried with backoff (at most 60 s
  apart, 5 s while its store does not serve the files); it never stops the others. Each
  ListHosted reports the replicas failing now, with a reason named after the cause
  (`common.hosted.LOAD_FAILURE_REASONS`) and the message, which the agent writes on the
  replica's loaded condition, so the TritonModel says why.
- ready: listed in the models file (a JSON list of `{"model", "maxConcurrency", "residency",
  "idleSeconds", "idempotent"}`, replaced whole; a model once, however many of its replicas
  are ready), which the host's proxy serves. An on-demand replica the proxy put to sleep (the
  agent reports it `sleeping`, state INSTALLED) stays listed and is not loaded here: its proxy
  wakes it on its next request.
- parked (the binder's parked-models annotation: the model is at zero replicas and this host
  is where its requests wait): listed as `{"model", "maxConcurrency", "parked": true}` until a
  replica of it is ready here (or, one served elsewhere, `unroute_seconds` after it left the
  annotation), so that the proxy holds its requests meanwhile; its files stay under ROOT when
  its replica leaves, so that its wake fetches nothing.
- every model, while the agent says the node pod stops (`node_stopping`: it is deleted or
  replaced; the binder takes the host out of its Services meanwhile): listed with
  `"leaving": true`, still loaded and served, so that the proxy closes its clients'
  connections and they reconnect through their Services to other nodes; listed as before
  once an agent says otherwise (a new node pod's: a model its Triton lacks is loaded again).
- draining, gone, or given another storage URI: still listed for `unroute_seconds`, with
  `"leaving": true` once no replica of its model here stays (the binder has taken the host out
  of its Service; requests routed before the endpoints caught up are answered, and the proxy
  closes their connections so that their clients reconnect through the Service), then removed
  from the models file; after `drain_seconds` (the proxy finishes its
  requests meanwhile) unloaded through the agent, then its files deleted. Another URI is then
  loaded as a new replica. One listed not draining again before its unload (the binder took it
  back: scaled up again) stays loaded and is listed again; after, it is loaded again.

A restarted loader starts from the models file it wrote: those models stay listed while the same
flow confirms them (the node still has their digest: nothing is sent again). Owns these decisions
and the files under ROOT; it must not parse settings (app.py) or touch gRPC (agentclient.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from common.atomicfile import replace_file
from common.contract import RESIDENCY_ON_DEMAND, ContractError, validate_model_id
from common.hosted import (
    HOST_MEMORY_REASON,
    LOAD_FAILED_REASON,
    LOAD_FAILURE_REPORT_CHARS,
    load_failure,
)
from common.modelpod import STORAGE_SECRET_DIR
from loader.agentclient import Hosted, HostedList, LoadFailure, ModelState
from loader.deadline import DEFAULT_FETCH_SECONDS
from loader.errors import (
    FetchError,
    HostMemoryError,
    InvalidModelError,
    LoaderError,
    ModelRejectedError,
    RefusedError,
    StoreUnavailableError,
    TimedOutError,
    TransientError,
    TritonRejectedError,
)
from loader.hostfiles import Fetch, HostFiles, fetch_off_loop
from loader.loading import Agent, Loading, Outcome, Timing
from loader.manifest import build_manifest
from loader.retry import Backoff
from loader.slots import Slots
from loader.validate import validate_model_directory

log = logging.getLogger(__name__)

# A replica that keeps failing is tried again at most this far apart.
_RETRY_MAX_SECONDS = 60.0
# ... and at most this far apart while its store does not serve its files (429, 5xx, not
# reached): a wake or a stand-in waiting on the store loads within seconds of its return.
_STORE_RETRY_MAX_SECONDS = 5.0


class HostAgent(Agent, Protocol):
    """The agent calls a host's loader needs: a model pod's, for one replica, and ListHosted."""

    def for_replica(self, ordinal: int) -> Agent: ...

    async def list_hosted(
        self, time_limit: float, failures: tuple[LoadFailure, ...] = ()
    ) -> HostedList: ...


@dataclass(frozen=True)
class HostTiming:
    """How often to look, how long a leaving replica stays loaded, and a replica's load."""

    poll_seconds: float
    drain_seconds: float
    call_seconds: float
    """One ListHosted or UnloadModel call."""
    load: Timing
    """A replica's load (loading.py), each attempt."""
    unroute_seconds: float = 0.0
    """A leaving replica stays listed (served) this long first: its Service stops sending here
    meanwhile."""
    drain_check_seconds: float = 0.5
    """How often to ask the proxy whether a leaving replica has drained."""
    fetch_seconds: float = DEFAULT_FETCH_SECONDS
    """A replica's fetch, in all (listing, downloads, unpacking): past it, it fails."""


@dataclass
class _Tracked:
    """What this loader knows and does about one replica."""

    model: str
    ordinal: int | None
    """None: listed by an earlier run (the models file names no ordinal), not yet matched."""
    uri: str | None
    """The storage URI its files come from; None: listed by an earlier run, not yet confirmed."""
    entry: dict[str, object]
    """Its line in the models file."""
    ready: bool = False
    published: bool = False
    leaving: bool = False
    unloading: bool = False
    """Its drain has reached the unload: a replica wanted again now is loaded anew after it."""
    job: asyncio.Task[None] | None = None
    failures: int = 0
    retry_at: float = 0.0
    reason: str = ""
    cause: str = ""
    """The reason the agent is told for the last failure (`common.hosted.LOAD_FAILURE_REASONS`)."""

    @property
    def loading(self) -> bool:
        """Being brought up, not failed so far: listed held (`parked`), so that a request
        routed here as the agent reports it loaded, before this loader lists it ready, waits
        for it rather than finding an unknown model."""
        return (
            self.job is not None
            and self.ordinal is not None
            and not (self.published or self.leaving or self.failures)
        )

    @property
    def key(self) -> tuple[str, int | None]:
        return (self.model, self.ordinal)

    @property
    def name(self) -> str:
        """Its directory's name under ROOT and its name in logs: `<model>.<ordinal>` (every
        name ends in its own ordinal, so no two replicas share one), or the model id while its
        ordinal is not known."""
        return self.model if self.ordinal is None else f"{self.model}.{self.ordinal}"


class Host:
    """The replicas of one model host, followed until `run`'s stop event is set."""

    def __init__(
        self,
        agent: HostAgent,
        root: Path,
        models_file: Path,
        timing: HostTiming,
        *,
        parallel: int,
        max_bytes: int,
        fetcher: Fetch = fetch_off_loop,
        proxy_holds: Callable[[str], Awaitable[bool | None]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        secret_dir: Path = Path(STORAGE_SECRET_DIR),
    ) -> None:
        self._agent = agent
        self._root = root
        self._models_file = models_file
        self._timing = timing
        self._slots = Slots(parallel)
        self._max_bytes = max_bytes
        self._proxy_holds = proxy_holds
        """Whether the host's proxy still serves a model (None: it cannot tell)."""
        self._clock = clock
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not secrets
        self._retry = Backoff(timing.load.backoff.initial, _RETRY_MAX_SECONDS)
        self._store_retry = Backoff(timing.load.backoff.initial, _STORE_RETRY_MAX_SECONDS)
        self._tracked: dict[tuple[str, int | None], _Tracked] = {}
        self._written: bytes | None = None
        self._parked: tuple[tuple[str, int], ...] = ()
        """The models parked on the host (scale to zero): listed with `parked` until ready."""
        self._unparked: dict[str, float] = {}
        """Models unparked with no replica here: listed parked until then (`_still_parked`)."""
        self._stop_fetching = threading.Event()
        self._files = HostFiles(
            root,
            secret_dir=secret_dir,
            max_bytes=max_bytes,
            fetch_seconds=timing.fetch_seconds,
            fetcher=fetcher,
            stop=self._stop_fetching,
        )
        self._said: set[str] = set()
        self._agent_problem = ""
        self._node_stopping = False
        """The agent said the node pod stops: every model is listed leaving until an agent
        says otherwise (kept while none answers)."""

    async def run(self, stop: asyncio.Event) -> None:
        """Poll and act until `stop` is set; then cancel what is under way and return."""
        self._root.mkdir(parents=True, exist_ok=True)
        self._adopt_published()
        try:
            while not stop.is_set():
                await self.poll()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self._timing.poll_seconds)
        finally:
            self._stop_fetching.set()
            jobs = [t.job for t in self._tracked.values() if t.job is not None]
            for job in jobs:
                job.cancel()
            await asyncio.gather(*jobs, return_exceptions=True)

    def ready_models(self) -> list[str]:
        """The models listed in the models file now."""
        return sorted({t.model for t in self._tracked.values() if t.published})

    async def poll(self) -> None:
        """One look at the host's replicas, and what follows from it."""
        try:
            listing = await self._agent.list_hosted(self._timing.call_seconds, self.failures())
        except (LoaderError, TransientError) as e:
            if str(e) != self._agent_problem:
                log.warning(
                    "Cannot list the host's replicas (%s): keeping the models as they are and "
                    "asking again every %.1f s.",
                    e,
                    self._timing.poll_seconds,
                )
            self._agent_problem = str(e)
            return
        if self._agent_problem:
            log.info("The agent lists the host's replicas again.")
            self._agent_problem = ""
        for refused in listing.refused:
            self._say_once(
                f"refused:{refused}",
                "The agent does not serve this host's replica %s: it is not loaded here.",
                refused,
            )
        if listing.node_stopping != self._node_stopping:
            self._node_stopping = listing.node_stopping
            log.info(
                "The node pod %s: %s.",
                "stops" if listing.node_stopping else "runs again",
                "listing every model leaving, still served, so that clients reconnect to other "
                "nodes"
                if listing.node_stopping
                else "the models are listed as they are served",
            )
        if listing.parked != self._parked or self._unparked:
            self._parked = self._still_parked(listing)
            self._publish()
        self.decide(listing.replicas)

    def _still_parked(self, listing: HostedList) -> tuple[tuple[str, int], ...]:
        """The models to list parked: those the agent lists, and those it no longer lists that
        the proxy must still hold. A model unparked as its replica here is served (or taken
        back while it drained) stays until this loader lists it ready: never out of the models
        file in between, even while a replica it had begun to unload is loaded again. One
        unparked with no replica here (one is served elsewhere) stays `unroute_seconds`, as a
        leaving replica does: the binder took the host out of its Service in the same write,
        and a request routed here before the endpoints caught up is held, not refused as an
        unknown model."""
        now = self._clock()
        parked = dict(listing.parked)
        wanted = {r.model_id for r in listing.replicas if not r.draining}
        for model, limit in self._parked:
            if model in parked:
                continue
            if model in wanted:
                mine = [t for t in self._tracked.values() if t.model == model]
                if not any(t.published for t in mine):
                    parked[model] = limit
            elif now < self._unparked.setdefault(model, now + self._timing.unroute_seconds):
                parked[model] = limit
        self._unparked = {m: t for m, t in self._unparked.items() if m in parked and t > now}
        for again, _ in listing.parked:
            self._unparked.pop(again, None)  # parked here again
        return tuple(sorted(parked.items()))

    def failures(self) -> tuple[LoadFailure, ...]:
        """The replicas whose last load failed and that are not served, with why (within
        LOAD_FAILURE_REPORT_CHARS, so that the call is never too big for the agent)."""
        found, left = [], LOAD_FAILURE_REPORT_CHARS
        for _, t in sorted(self._tracked.items(), key=_order):
            if t.failures and not t.ready and not t.leaving:
                failure = LoadFailure(
                    t.model, *load_failure(t.cause, t.reason), replica=t.ordinal or 0
                )
                left -= len(failure.model_id) + len(failure.message) + len(failure.reason)
                if left < 0:
                    break
                found.append(failure)
        return tuple(found)

    def decide(self, replicas: tuple[Hosted, ...]) -> None:
        """Start what the replicas call for, and list the ready models."""
        wanted: dict[tuple[str, int | None], Hosted] = {
            (r.model_id, r.replica): r
            for r in replicas
            if not r.draining and self._named(r.model_id)
        }
        self._match_adopted(wanted)
        now = self._clock()
        for key, tracked in list(self._tracked.items()):
            model = tracked.name
            replica = wanted.get(key)
            if replica is not None:
                tracked.entry = _entry(replica)
            moved = replica is not None and tracked.uri not in (None, replica.storage_uri)
            if replica is None or moved:
                self._leave(tracked, "it moved to new files" if moved else "it left the host")
            elif tracked.leaving and not tracked.unloading and tracked.job is not None:
                tracked.job.cancel()  # wanted again while it drains: `_drain` takes it back
            elif tracked.job is None and not tracked.leaving:
                if tracked.uri is None and tracked.ready and replica.status.sleeping:
                    # Listed by an earlier run and asleep on the node since: loading it would
                    # undo its proxy's sleep. Confirmed as it is; its next request wakes it.
                    tracked.uri = replica.storage_uri
                    log.info("Model %s is asleep on the node: still listed.", model)
                    continue
                lost = tracked.ready and replica.status.state is ModelState.ABSENT
                if lost or tracked.uri is None or (not tracked.ready and now >= tracked.retry_at):
                    if lost:
                        log.warning("The node lost model %s: loading it again.", model)
                    self._start_load(tracked, replica)
        for key, replica in wanted.items():
            if key not in self._tracked:
                tracked = self._tracked[key] = _Tracked(
                    replica.model_id, replica.replica, replica.storage_uri, _entry(replica)
                )
                self._start_load(tracked, replica)
        self._publish()

    def _match_adopted(self, wanted: dict[tuple[str, int | None], Hosted]) -> None:
        """An entry an earlier run listed (its ordinal unknown) becomes a replica of its model
        the agent lists and this run does not track yet, confirmed by the same flow; with none,
        it leaves."""
        for key, tracked in list(self._tracked.items()):
            if tracked.ordinal is not None or tracked.job is not None or tracked.leaving:
                continue
            free = sorted(k for k in wanted if k[0] == tracked.model and k not in self._tracked)
            if free:
                del self._tracked[key]
                tracked.ordinal = free[0][1]
                self._tracked[tracked.key] = tracked

    def _named(self, model: str) -> bool:
        """Whether `model` is a model id, safe as a name under ROOT (the agent checks it too)."""
        try:
            validate_model_id(model)
        except ContractError as e:
            self._say_once(f"name:{model}", "The agent lists a replica this host ignores: %s.", e)
            return False
        return True

    def _leave(self, tracked: _Tracked, why: str) -> None:
        if tracked.leaving:
            return
        if tracked.job is not None:
            if not tracked.job.done():
                tracked.job.cancel()
            return  # its end brings it back here
        tracked.leaving = True
        was_published = tracked.published
        tracked.ready = False
        log.info(
            "Model %s is leaving this host (%s): %s.",
            tracked.name,
            why,
            f"served {self._timing.unroute_seconds:g} s more, then removed from the models "
            f"file and unloaded {self._timing.drain_seconds:g} s later"
            if was_published
            else "unloading it",
        )
        self._run(tracked, self._drain(tracked, was_published))

    def _start_load(self, tracked: _Tracked, replica: Hosted) -> None:
        tracked.uri = replica.storage_uri
        self._run(tracked, self._bring_up(tracked, replica))

    def _run(self, tracked: _Tracked, work: Awaitable[None]) -> None:
        async def guarded() -> None:
            try:
                await work
            except Exception:
                # A bug, not a model's failure (those are handled where they happen): say it;
                # the next poll starts over for this model.
                log.exception("The work on model %s has failed.", tracked.name)
                tracked.leaving = tracked.ready = tracked.published = False
                tracked.unloading = False
            finally:
                tracked.job = None

        tracked.job = asyncio.create_task(guarded(), name=f"model {tracked.name}")

    async def _bring_up(self, tracked: _Tracked, replica: Hosted) -> None:
        model = tracked.name
        try:
            async with self._slots.hold(tracked.model, retrying=tracked.failures > 0):
                outcome = await self._load(model, replica)
        except asyncio.CancelledError:
            if self._stop_fetching.is_set():
                raise
            tracked.ready = False
            log.info("Stopped loading model %s: it is no longer wanted as it was.", model)
            return
        except (LoaderError, TransientError) as e:
            self._failed(tracked, str(e), _cause(e), store=isinstance(e, StoreUnavailableError))
            return
        except Exception as e:
            log.exception("Loading model %s failed unexpectedly.", model)
            self._failed(tracked, f"an unexpected error: {e!r}", LOAD_FAILED_REASON)
            return
        first = not tracked.ready
        tracked.ready = tracked.published = True
        tracked.failures, tracked.reason, tracked.cause = 0, "", ""
        if first:
            summary = outcome.summary()
            log.info("%s%s; the host's proxy serves it.", summary[:1].upper(), summary[1:])
        self._publish()

    async def _load(self, model: str, replica: Hosted) -> Outcome:
        """Fetch (into ROOT/`model`, the replica's own name) and load the replica."""
        directory = await self._files.fetched(model, replica)
        checked = await asyncio.to_thread(
            validate_model_directory, directory, replica.model_id, self._max_bytes
        )
        manifest = await asyncio.to_thread(build_manifest, checked.files)
        agent = self._agent.for_replica(replica.replica)
        loading = Loading(agent, checked, manifest, self._timing.load, clock=self._clock)
        return await loading.run()

    def _failed(self, tracked: _Tracked, reason: str, cause: str, *, store: bool = False) -> None:
        """Count a failure and set when to try again (sooner when `store`: the store did not
        serve the files now, `StoreUnavailableError`)."""
        tracked.failures += 1
        tracked.cause = cause
        delay = (self._store_retry if store else self._retry).delay(tracked.failures, self._rng)
        tracked.retry_at = self._clock() + delay
        tracked.ready = tracked.published = False
        tracked.reason = reason
        log.error(
            "Model %s is not served by this host: %s. Trying again in %.1f s (failure %d).",
            tracked.name,
            reason,
            delay,
            tracked.failures,
        )
        self._publish()

    async def _drained(self, model: str) -> None:
        """Wait until the proxy has finished `model`'s requests (it drops the model's series
        then), at most `drain_seconds`."""
        deadline = self._clock() + self._timing.drain_seconds
        while (left := deadline - self._clock()) > 0:
            holds = await self._proxy_holds(model) if self._proxy_holds is not None else None
            if holds is False:
                log.info("The proxy has drained model %s: unloading it now.", model)
                return
            await asyncio.sleep(min(left, self._timing.drain_check_seconds))

    async def _drain(self, tracked: _Tracked, was_published: bool) -> None:
        model = tracked.name
        agent: Agent = (
            self._agent if tracked.ordinal is None else self._agent.for_replica(tracked.ordinal)
        )
        if was_published:
            try:
                await asyncio.sleep(self._timing.unroute_seconds)
                tracked.published = False
                self._publish()
                await self._drained(tracked.model)
            except asyncio.CancelledError:
                if self._stop_fetching.is_set():
                    raise
                tracked.leaving = False
                tracked.ready = tracked.published = True
                log.info(
                    "Model %s is wanted here again while it drains: it stays loaded, and the "
                    "host's proxy serves it again.",
                    model,
                )
                self._publish()
                return
        tracked.unloading = True
        try:
            await agent.unload(tracked.model, self._timing.call_seconds)
        except TransientError as e:
            try:
                status = await agent.get_model(tracked.model, self._timing.call_seconds)
            except (LoaderError, TransientError):
                status = None
            if status is None or status.state is not ModelState.ABSENT:
                tracked.leaving = tracked.unloading = False  # the next poll tries again
                tracked.failures += 1
                log.warning("Cannot unload model %s yet (%s): trying again.", model, e)
                return
        except LoaderError as e:
            # The agent no longer lets this host act on a replica that left it; it unloads such
            # replicas itself.
            log.info("The agent did not unload model %s for this host (%s).", model, e)
        else:
            log.info("Unloaded model %s: it left this host.", model)
        if all(tracked.model != parked for parked, _ in self._parked):
            # A model parked here keeps its files: its wake fetches nothing again.
            self._files.remove(model)
        del self._tracked[tracked.key]

    def _adopt_published(self) -> None:
        """Keep listing what an earlier run of this loader listed, until confirmed or gone."""
        try:
            data = self._models_file.read_bytes()
            entries = json.loads(data)
        except (OSError, ValueError):
            entries = []
        else:
            self._written = data  # rewritten only once it changes
        for entry in entries if isinstance(entries, list) else []:
            model = entry.get("model") if isinstance(entry, dict) else None
            if isinstance(model, str) and (model, None) not in self._tracked:
                self._tracked[(model, None)] = _Tracked(
                    model, None, None, dict(entry), ready=True, published=True
                )
        if self._tracked:
            log.info(
                "Still listing %s from before this loader started, until the agent confirms them.",
                ", ".join(sorted(model for model, _ in self._tracked)),
            )
        self._publish()

    def _publish(self) -> None:
        """Write the models file (`_listing`), when it changes."""
        listed = _listing(self._tracked, self._parked, node_stopping=self._node_stopping)
        data = json.dumps(listed, separators=(",", ":")).encode() + b"\n"
        if data == self._written:
            return
        replace_file(self._models_file, data, ".models-")
        self._written = data
        log.info(
            "The models file lists %s.", ", ".join(str(e["model"]) for e in listed) or "no model"
        )

    def _say_once(self, key: str, message: str, *args: object) -> None:
        if key not in self._said:
            self._said.add(key)
            log.warning(message, *args)


def _listing(
    tracked: dict[tuple[str, int | None], _Tracked],
    parked: tuple[tuple[str, int], ...],
    *,
    node_stopping: bool,
) -> list[dict[str, object]]:
    """The models file: one entry per model with a replica ready here (its line; the replicas
    of a model share the model's settings), then the models parked or loading here. The node
    gateway reaches one replica of a model at a time, so the model's limit is one replica's
    `maxConcurrency`."""
    merged: dict[str, dict[str, object]] = {}
    staying: set[str] = set()
    for _, t in sorted(tracked.items(), key=_order):
        if t.published:
            merged.setdefault(t.model, t.entry)
            if not t.leaving and not node_stopping:
                staying.add(t.model)
    held = dict(parked)
    for t in tracked.values():
        if t.loading and t.model not in held:
            limit = t.entry.get("maxConcurrency")
            held[t.model] = limit if isinstance(limit, int) else 0
    for model, entry in merged.items():
        if model not in staying and (model not in held or node_stopping):
            # Every replica of it here drains, and none is parked or loading here, or the
            # node pod stops: its Service no longer routes here, and the proxy sends its
            # clients there (`leaving`: their connections close).
            merged[model] = entry | {"leaving": True}
    listed = list(merged.values())
    listed += [
        {"model": m, "parked": True} | ({"maxConcurrency": c} if c else {})
        for m, c in sorted(held.items())
        if m not in merged
    ]
    return listed


def _order(item: tuple[tuple[str, int | None], _Tracked]) -> tuple[str, int]:
    """Tracked replicas by model, then ordinal (an adopted entry first)."""
    model, ordinal = item[0]
    return model, -1 if ordinal is None else ordinal


def _cause(e: LoaderError | TransientError) -> str:
    """The reason the agent is told for a failed load (`common.hosted.LOAD_FAILURE_REASONS`)."""
    for kind, reason in (
        (FetchError, "FetchFailed"),
        (InvalidModelError, "ModelInvalid"),
        (TritonRejectedError, "ModelInvalid"),
        (HostMemoryError, HOST_MEMORY_REASON),
        (ModelRejectedError, "ModelRejected"),
        (RefusedError, "LoadRefused"),
        (TimedOutError, "LoadTimedOut"),
    ):
        if isinstance(e, kind):
            return reason
    return LOAD_FAILED_REASON


def _entry(replica: Hosted) -> dict[str, object]:
    entry: dict[str, object] = {"model": replica.model_id}
    if replica.max_concurrency:
        entry["maxConcurrency"] = replica.max_concurrency
    if replica.residency == RESIDENCY_ON_DEMAND:
        entry["residency"] = RESIDENCY_ON_DEMAND
    if replica.idle_seconds:
        entry["idleSeconds"] = replica.idle_seconds
    if replica.idempotent is not None:
        entry["idempotent"] = replica.idempotent
    return entry
