"""The models a proxy serves: its table, one entry per public model id.

A model pod's proxy serves a table of one, built from --model-id; a model host's proxy reads its
table from --models-file (written by the host's loader: a JSON list of objects, each with `model`,
the public model id, and optionally `maxConcurrency`, `residency`, `idleSeconds`, `parked`,
`leaving` and `idempotent`) and follows it as the file is replaced. Each entry has its own
concurrency limit (its `maxConcurrency`, else the proxy's --container-concurrency) and queue
(`policy.limiter`) and its own metrics (`metrics.ProxyMetrics`, labelled with its model id); the
relays find a request's entry with one dict lookup (`served`), whatever the table's size. An
`on-demand` entry gets its own residency (proxy.residency, made by the proxy's `make`), asleep
after its `idleSeconds`; a `parked` one (at zero replicas) holds its requests until it is served
(proxy.parking); a `leaving` one is served, its clients' connections closed after their
requests.

In the node gateway a model host's table names private names: each entry has the name Triton
knows its replica by (`triton_name`), and the relays map the public id in a request, and in
Triton's answers, to and from that entry's private name (`private`, `private_encoded`). An entry
may stand for replicas of its model on the host (`Replicas`, one or several): each request goes
to the one with the fewest requests held, and is mapped to its private name once picked.

A model that leaves the table is drained: the routers stop naming it at once (for
`LEFT_SECONDS` its new inference requests are answered "retry", REST 503 with `Retry-After` and
gRPC UNAVAILABLE, its streams end so; then as Triton answers for a model it does not have), the
requests it has in flight finish, and after them (or after the drain bound) its entry and its
metrics go. The table is no
authorization: the node gateway and the agent check each replica's proof; this only narrows what
the proxy forwards. What it must not do: talk to Triton or the agent, or relay bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

from common.atomicfile import read_file
from common.contract import RESIDENCY_ALWAYS, ContractError, validate_model_id
from common.hosted import serving_fields
from proxy.metrics import ProxyMetrics
from proxy.policy.limiter import Limiter
from proxy.policy.naming import name_fields

log = logging.getLogger(__name__)


class TableError(ValueError):
    """The models file cannot be read or does not hold a list of models."""


@dataclass(frozen=True)
class Entry:
    """One line of the models file."""

    model: str
    """The public model id."""
    max_concurrency: int = 0
    """Its requests in flight; 0: the proxy's --container-concurrency."""
    idle_seconds: int = 0
    """Its on-demand idle time (seconds); 0: the proxy's --idle-seconds."""
    residency: str = RESIDENCY_ALWAYS
    """`always`, or `on-demand`: put to sleep when idle, woken by its next request."""
    parked: bool = False
    """At zero replicas, parked here: its requests wait until it is ready (`proxy.parking`)."""
    leaving: bool = False
    """Leaving the host (its Service no longer routes here): still served, and each connection
    a request of it comes on is closed after that request's answer (REST: `Connection: close`;
    gRPC: GOAWAY), so that its clients reconnect through the Service."""
    idempotent: bool | None = None
    """Its calls may run twice (no sequence batcher, no side effects): one lost before its
    answer began is sent again (`Served.resend`); false: never; None: as its config says
    (`Served.learned`)."""


LEFT_SECONDS: Final = 60.0
"""How long a model that left the table is answered "served elsewhere: retry" (REST 503 with
`Retry-After`, gRPC UNAVAILABLE) rather than Triton's unknown-model answer: a client whose
connection outlived the model's time here, or that the Service's endpoints had not caught up
for, retries through the Service, which routes to a host that serves it."""
RESEND_BYTES: Final = 1024 * 1024
"""The most of one request a proxy keeps to send again (`Served.resend`); a larger one is not
kept, and fails as any other model's if its connection goes under it."""
RESENDS: Final = 2
"""The most times one request is sent again: Triton exiting in a row (a neighbour's crashing
load loads again after the others) may lose it more than once; a request that crashes Triton
crashes it at most this many times more (the crash quarantine counts each exit)."""


class Served:
    """One model of the table: its limiter and its metrics."""

    __slots__ = (
        "draining_since",
        "entry",
        "learned",
        "limiter",
        "metrics",
        "model_id",
        "names",
        "private",
        "public",
        "replicas",
        "resend",
        "route",
        "spread",
    )

    def __init__(
        self,
        model_id: str,
        limiter: Limiter,
        metrics: ProxyMetrics,
        entry: Entry | None = None,
        triton_name: str = "",
    ) -> None:
        self.model_id = model_id
        self.limiter = limiter
        self.metrics = metrics
        self.entry = entry or Entry(model_id)
        """Its line of the models file: its own limit, and its idle time for residency."""
        self.public = model_id.encode()
        self.private = triton_name.encode() if triton_name and triton_name != model_id else b""
        """The model's private name in Triton, encoded; empty: Triton knows it by its id."""
        self.names: tuple[bytes, bytes, bytes, bytes] | None = (
            (self.private, self.public, *name_fields(self.private, self.public))
            if self.private
            else None
        )
        """What renaming Triton's gRPC answers needs (`grpc.channel`); None: nothing to do."""
        self.draining_since: float | None = None
        """When the model left the table (monotonic seconds); None while it is in it."""
        self.replicas: Replicas | None = None
        """On the table's entry of a model served by replicas to pick from: all of them."""
        self.resend = False
        """A call of it lost before its answer began, with the connection to the node gateway
        or (the gateway says so) with the gateway's to Triton, goes again, up to RESENDS times
        (`Entry.idempotent`; set by a pod's proxy only: the gateway keeps no copy of a call)."""
        self.learned: bool | None = None
        """Whether its config in Triton lets its calls run twice (`calls_may_run_twice`), once
        read (`app.ProxyApp.learn_resends`); what `resend` follows when `Entry.idempotent` is
        unset."""
        self.judge()
        self.spread = False
        """One of a model's replicas (`Replicas`): the relays map its private name once it is
        picked; the routers name its public id."""
        self.route: tuple[str, int, int] | None = None
        """A model of the namespace served elsewhere (`proxy.mesh`): its Service's address, REST
        and gRPC ports, where the router's ports relay its requests; None: served here."""

    def judge(self) -> None:
        """Set `resend` from its entry's `idempotent`, or when unset from `learned` (false
        while its config is not read)."""
        declared = self.entry.idempotent
        self.resend = declared if declared is not None else self.learned is True


class Replicas:
    """The replicas of one model behind its public id (a model host's, at the node gateway:
    one or several), each a `Served` with its own limiter and private name. `pick` gives a
    request the one with the fewest requests held (in flight or queued), ties in turn, so that
    requests spread evenly and none queues at a busy replica while another is idle."""

    __slots__ = ("_next", "members")

    def __init__(self, members: list[Served]) -> None:
        self.members = members
        self._next = 0
        for member in members:
            member.spread = True
        members[0].replicas = self

    def pick(self) -> Served:
        """The replica for the next request."""
        members = self.members
        count = len(members)
        chosen = start = self._next
        fewest = members[start].limiter.held
        for step in range(1, count):
            index = (start + step) % count
            held = members[index].limiter.held
            if held < fewest:
                chosen, fewest = index, held
        self._next = (chosen + 1) % count
        return members[chosen]


class ConfigReads:
    """When to read again the config in Triton of a model whose calls say neither way whether
    they may run twice (`Served.learned` unset): Triton has no config for a model not loaded
    (asleep, parked, loading), so each miss doubles the rounds skipped before the next read, up
    to `most_rounds`, and a request of it that has gone to Triton since (`Limiter.last`) makes
    it due at once: a woken model is read on the next round, a sleeping one about once a
    minute, not each round."""

    __slots__ = ("_misses", "most_rounds")

    def __init__(self, most_rounds: int) -> None:
        self.most_rounds = most_rounds
        self._misses: dict[str, tuple[Served, int, int, float]] = {}
        """Model id -> (its entry read, rounds left to skip, rounds to skip after the next
        miss, its limiter's last slot at the miss)."""

    def due(self, served: Served) -> bool:
        """Whether to read `served`'s config this round (one call a round for each model)."""
        missed = self._misses.get(served.model_id)
        if missed is None or missed[0] is not served:
            return True
        _, skip, after, last = missed
        if skip <= 0 or served.limiter.last != last:
            return True
        self._misses[served.model_id] = (served, skip - 1, after, last)
        return False

    def missed(self, served: Served) -> None:
        """Triton had no config for `served` this round."""
        missed = self._misses.get(served.model_id)
        after = missed[2] if missed is not None and missed[0] is served else 1
        self._misses[served.model_id] = (
            served,
            after,
            min(2 * after, self.most_rounds),
            served.limiter.last,
        )

    def read(self, served: Served) -> None:
        """`served`'s config was read: nothing more to schedule for it."""
        self._misses.pop(served.model_id, None)

    def keep(self, model_ids: set[str]) -> None:
        """Forget the models no longer in the table."""
        for gone in self._misses.keys() - model_ids:
            del self._misses[gone]


def read_models(path: Path) -> list[Entry]:
    """The entries of the models file at `path`, in its order, each model once (the first)."""
    data = read_file(
        path,
        "models file",
        TableError,
        "the host's loader writes it (--models-file) as its models become ready",
    )
    assert data is not None
    try:
        entries = json.loads(data) if data.strip() else []
    except ValueError as e:
        raise TableError(f"the models file {path} is not JSON ({e}); write a JSON list") from e
    if not isinstance(entries, list):
        raise TableError(f"the models file {path} holds no JSON list of models")
    models: dict[str, Entry] = {}
    for number, entry in enumerate(entries, 1):
        name = entry.get("model") if isinstance(entry, dict) else None
        if not isinstance(name, str):
            raise TableError(
                f"entry {number} of the models file {path} has no `model` (the public model id)"
            )
        try:
            validate_model_id(name)
        except ContractError as e:
            raise TableError(f"entry {number} of the models file {path}: {e}") from e
        try:
            concurrency, idle_seconds, residency, idempotent = serving_fields(entry)
        except ValueError as e:
            raise TableError(f"entry {number} of the models file {path}: {e}") from e
        parked = entry.get("parked", False)
        if not isinstance(parked, bool):
            raise TableError(
                f"entry {number} of the models file {path}: `parked` {parked!r} is not true or "
                f"false"
            )
        leaving = entry.get("leaving", False)
        if not isinstance(leaving, bool):
            raise TableError(
                f"entry {number} of the models file {path}: `leaving` {leaving!r} is not true "
                f"or false"
            )
        if name not in models:
            models[name] = Entry(
                name, concurrency, idle_seconds, residency, parked, leaving, idempotent
            )
    return list(models.values())


class MeshViews(Protocol):
    """What the namespace router's listeners read (`proxy.mesh.MeshTable`): the names they
    accept and each one's entry, the table's own or a relayed model's (`Served.route`)."""

    names: set[str]
    encoded: set[bytes]
    models: dict[str, Served]
    served: dict[bytes, Served]


class ModelTable:
    """The served models by model id, and the names the routers accept (the same ids, as text
    for REST and as bytes for gRPC: sets the routers hold and read on every decision)."""

    def __init__(
        self,
        make: Callable[[Entry], Served],
        *,
        drain_seconds: float,
        limits: Callable[[Entry], tuple[int, int]] | None = None,
        on_change: Callable[[], None] | None = None,
        on_remove: Callable[[Served], None] | None = None,
        on_retune: Callable[[Served], None] | None = None,
        renames: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._make = make
        self._limits = limits
        """An entry's (concurrency limit, queue limit), applied when its line changes."""
        self.renames = renames
        """Its entries may have private names (the node gateway's): the relays map them."""
        self.on_remove = on_remove
        """Told of each entry once it is removed (drained)."""
        self._on_retune = on_retune
        """Told of each entry whose line changed (its idle time, for its residency)."""
        self.drain_seconds = drain_seconds
        self.on_change = on_change
        """Told after models join or leave (the REST relay forgets its prepared heads)."""
        self._clock = clock
        self.models: dict[str, Served] = {}
        """Every entry with requests to serve or finish, draining ones too: the relays' look-up."""
        self.names: set[str] = set()
        """The model ids requests may name now (not the draining ones)."""
        self.encoded: set[bytes] = set()
        self.served: dict[bytes, Served] = {}
        """`models` by encoded model id (the gRPC relay's look-up)."""
        self.private: dict[str, str] = {}
        """The private name in Triton of each model that has one (REST paths)."""
        self.private_encoded: dict[bytes, bytes] = {}
        """`private`, encoded (gRPC messages)."""
        self.left: set[str] = set()
        """The model ids that left the table within `LEFT_SECONDS` (draining or removed), and
        are not back: the routers answer them "retry" (`LEFT_SECONDS`)."""
        self.left_encoded: set[bytes] = set()
        self._left_at: dict[str, float] = {}
        self._identity: tuple[int, int, int] | None = None
        self._waiting_said = False

    @classmethod
    def of_one(cls, served: Served) -> ModelTable:
        """A model pod's table: its one model, `served` with the pod's own limiter and metrics
        (it never changes: the pod serves that model until it goes)."""
        table = cls(lambda entry: served, drain_seconds=0.0)
        table.set_models([served.entry])
        return table

    def set_models(self, wanted: list[Entry]) -> None:
        """Serve exactly `wanted`: new ones join, the others start draining; an entry whose limit
        changed keeps its queue and metrics and takes the new limit."""
        changed = False
        for entry in wanted:
            name = entry.model
            served = self.models.get(name)
            if served is not None and served.entry != entry:
                self._change(served, entry)
            if served is None:
                served = self.models[name] = self.served[name.encode()] = self._make(entry)
                if served.private and not served.spread:  # a spread one's is mapped once picked
                    self.private[name] = served.private.decode()
                    self.private_encoded[served.public] = served.private
                log.info("Serving model %s.", name)
            elif served.draining_since is not None:
                served.draining_since = None
                log.info("Model %s is back in the table: serving it again.", name)
            else:
                continue
            self.names.add(name)
            self.encoded.add(name.encode())
            if self._left_at.pop(name, None) is not None:
                self.left.discard(name)
                self.left_encoded.discard(name.encode())
            changed = True
        names = {entry.model for entry in wanted}
        for name, served in self.models.items():
            if name not in names and served.draining_since is None:
                served.draining_since = self._left_at[name] = self._clock()
                self.names.discard(name)
                self.encoded.discard(name.encode())
                self.left.add(name)
                self.left_encoded.add(name.encode())
                changed = True
                log.info(
                    "Model %s left the table: refusing its new requests, removing it once its "
                    "%d in flight finish (at most %.1f s).",
                    name,
                    served.limiter.held,
                    self.drain_seconds,
                )
        self.sweep()
        if changed and self.on_change is not None:
            self.on_change()

    def _change(self, served: Served, entry: Entry) -> None:
        served.entry = entry
        if self._on_retune is not None:
            self._on_retune(served)
        if self._limits is None:
            return
        limit, queue_limit = self._limits(entry)
        limiter = served.limiter
        if (limit, queue_limit) != (limiter.own_limit, limiter.queue_limit):
            log.info("Model %s's concurrency limit is now %s.", entry.model, limit or "none")
            limiter.own_limit, limiter.queue_limit = limit, queue_limit
            limiter.set_limit(limit)

    def sweep(self) -> None:
        """Remove the draining entries with nothing in flight, or past the drain bound; forget
        the models that left `LEFT_SECONDS` ago."""
        now = self._clock()
        forgot = False
        for name, left_at in list(self._left_at.items()):
            if now - left_at >= LEFT_SECONDS:
                del self._left_at[name]
                self.left.discard(name)
                self.left_encoded.discard(name.encode())
                forgot = True
        if forgot and self.on_change is not None:
            self.on_change()  # the relays' prepared answers for it go too
        for name, served in list(self.models.items()):
            since = served.draining_since
            if since is None:
                continue
            if served.limiter.held == 0 or now - since >= self.drain_seconds:
                self._remove(name, served)
                log.info("Model %s is drained: removed from the table.", name)

    def retire(self, names: set[str]) -> None:
        """Remove these draining entries at once, in flight or not, so that their models'
        next entries are made anew (in the node gateway: another replica of the model behind
        the same id, under its own private name); the requests in flight finish on the entry
        they hold. Without it, an entry wanted back while requests are in flight would come
        back as it was."""
        for name in sorted(names):
            served = self.models.get(name)
            if served is not None and served.draining_since is not None:
                self._remove(name, served)

    def _remove(self, name: str, served: Served) -> None:
        del self.models[name]
        del self.served[name.encode()]
        self.private.pop(name, None)
        self.private_encoded.pop(served.public, None)
        served.metrics.forget()
        if self.on_remove is not None:
            self.on_remove(served)

    def reread(self, path: Path) -> None:
        """Follow the models file: read it again when its identity changed (inode, size,
        mtime); a file that cannot be read keeps the table as it is, and says why."""
        try:
            stat = path.stat()
        except FileNotFoundError:
            # A host starts before its loader has made any model ready: no table yet.
            if self._identity is not None or not self._waiting_said:
                log.info("No models file %s yet: serving no model until it is written.", path)
                self._waiting_said = True
            self._identity = None
            self.set_models([])
            return
        except OSError as e:
            log.error("Cannot read the models file %s (%s): keeping the table.", path, e.strerror)
            self.sweep()
            return
        identity = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        if identity != self._identity:
            try:
                wanted = read_models(path)
            except TableError as e:
                log.error("%s: keeping the table.", e)
            else:
                self._identity = identity
                self.set_models(wanted)
                return
        self.sweep()

    async def follow(self, path: Path, period: float, stop: asyncio.Event) -> None:
        """Reread `path` every `period` seconds until `stop` is set."""
        while not stop.is_set():
            self.reread(path)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), period)
