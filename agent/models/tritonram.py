"""Triton's host memory, admitted like its GPU memory: its container's limit, what each loaded
model is billed, and whether a load still fits.

The limit is `--triton-memory-limit` (set from the downward API's `limits.memory` of Triton's
container), else the `memory.max` of Triton's cgroup where the agent can read it. Triton's use is
the resident memory of its process tree (`agent.gpus.processes`), read before and after each load,
split into what each model's own processes hold (the Python backend runs each model instance in
a stub process of its own) and what Triton's own process holds. A loaded model is billed:

- what its own processes hold, read afresh at every admission (no other tenant can grow them);
- the growth of Triton's own process across its load, only when its window was quiet: no other
  load or unload overlapped it, and the node gateway's activity table (`agent.models.quietwindow`)
  shows no other model's request in flight, begun or ended in it. A neighbour's request may grow
  Triton meanwhile, so a window that was not quiet bills none of that growth to a model that runs
  apart, and at most what the load was admitted on to a model that runs inside Triton's process.
  Until the table reaches the load's end the model is billed that lesser figure;
- only a quiet window's figure is remembered for its files (per manifest digest), so every later
  load of the same files is admitted on it.

A load fits when Triton's use now, the loads admitted and still under way, and this load's figure
(until measured `--triton-memory-per-load`; never less than its files) stay under the limit minus
`--triton-memory-reserve` (requests in flight, Triton's own growth). The room left for models is
shared by namespace: a namespace's loaded models (each charged its billed figure, at least
`--triton-memory-floor`, so a model of one byte costs what a load really costs) and its loads under
way stay within `--triton-memory-namespace-percent` of it, so no namespace can fill Triton before
another loads (the namespace is the first part of the pod's key, a replica's too). Otherwise it is
refused with `HostMemoryExhaustedError` before Triton sees it: a load that would take the container
past its limit gets the OOM killer, which ends every tenant's model at once.
A namespace whose models' own processes grow past its share (by more than the floor) loses its
largest models that run apart until the rest fits (`over_share`; `agent.models.overrequest`
unloads them).
With no limit or no Triton PID nothing is admitted here. Blocking reads: callers run it off the
event loop. It must not call Triton.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from agent.errors import HostMemoryExhaustedError
from agent.gpus.processes import TritonProcesses, TritonTree
from common.hosted import HOST_MEMORY_REASON

log = logging.getLogger(__name__)

MIB = 1024 * 1024
EVENT_REASON = HOST_MEMORY_REASON
REMEMBERED = 10_000
SETTLE_SECONDS = 30.0
"""How long after a load its window may still be found quiet (the gateway's table writes at least
every 2 s while it lives); past it the load keeps the figure that no neighbour could inflate."""

Quiet = Callable[[str, float, float], bool | None]
"""Whether no model but the named one was served between two Unix times: True, False, or None
while that cannot be told yet (`agent.models.quietwindow`)."""


@dataclass(frozen=True)
class HostMemoryRules:
    """What the admission decides by (bytes; limit 0: none given)."""

    limit: int = 0
    reserve: int = 1024 * MIB
    per_load: int = 512 * MIB
    floor: int = 64 * MIB
    """The least a loaded model is charged to its namespace, whatever it was measured at."""
    namespace_percent: float = 50.0
    """The part of the room for models (limit less reserve) one namespace may hold."""

    def share(self, limit: int) -> int:
        """The bytes of Triton's host memory one namespace's models may hold."""
        return int(max(limit - self.reserve, 0) * self.namespace_percent / 100)


@dataclass(frozen=True)
class Admitted:
    """A load let through: Triton's tree before it and what it was admitted on."""

    name: str
    digest: str
    before: TritonTree
    need: int
    namespace: str = ""
    started: float = 0.0
    """Unix seconds when it was admitted: its window's start."""


@dataclass(frozen=True)
class OverShare:
    """A model that runs apart, unloaded because its namespace holds more than its share."""

    name: str
    namespace: str
    bytes: int
    """What the model is billed now."""
    held: int
    """What its namespace's models are billed now, each at least the floor."""
    share: int


@dataclass
class Charge:
    """What a loaded model is billed of Triton's host memory, and how it was measured."""

    namespace: str
    own: int
    """What its own processes (its Python backend stubs) held at the last reading; 0 for a model
    that runs inside Triton's process."""
    apart: bool
    """It runs in processes of its own: `own` is read afresh at every admission."""
    triton: int
    """The growth of Triton's own process across its load billed to it: all of it when its
    window was quiet; none when it was not and the model runs apart; at most what it was
    admitted on when it was not and the model runs inside Triton's process."""
    sure: int = 0
    """That growth whole: billed once the window is found quiet."""
    digest: str = ""
    ended: float = 0.0
    """Unix seconds when its load ended; 0 once its window is settled."""
    started: float = 0.0

    @property
    def bytes(self) -> int:
        return self.own + self.triton


class HostMemory:
    """Admits loads against Triton's memory limit and measures them (thread-safe)."""

    def __init__(
        self,
        processes: TritonProcesses,
        rules: HostMemoryRules,
        *,
        quiet: Quiet,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._processes = processes
        self.rules = rules
        self._quiet = quiet
        """Asks whether a load's window was quiet (a node without a gateway: never)."""
        self._wall = wall
        self._lock = threading.Lock()
        self._in_flight: dict[str, tuple[str, int]] = {}
        """Name in Triton -> (namespace, bytes admitted) of the loads under way."""
        self._overlapped: set[str] = set()
        """Loads under way that another load, or an unload, overlapped: their window is shared."""
        self._charged: dict[str, Charge] = {}
        """Name in Triton -> what the loaded model is billed (at least the floor counts)."""
        self.by_digest: dict[str, int] = {}
        """Manifest digest -> bytes a load of those files was measured to take, in a quiet
        window only."""
        self.used = 0
        """Triton's resident bytes at the last reading."""
        self._limit: int | None = None

    def limit(self) -> int | None:
        """The flag's limit, else Triton's cgroup's (read once found); None when unknown."""
        if self.rules.limit:
            return self.rules.limit
        if self._limit is None:
            self._limit = self._processes.memory_limit()
        return self._limit

    def admit(self, name: str, digest: str, files: int, model_id: str, pod: str) -> Admitted | None:
        """Let a load through, or raise HostMemoryExhaustedError; None when nothing is known
        (no limit, or Triton's PID), and the load goes unmeasured. `pod` is the owner's
        namespace/name (a replica's namespace/model/ordinal)."""
        limit = self.limit()
        if limit is None:
            return None
        self.settle()
        tree = self._processes.tree()
        if tree is None:
            return None
        namespace = pod.partition("/")[0]
        rules = self.rules
        need = max(self.by_digest.get(digest, rules.per_load), files, rules.floor)
        measured = (
            "measured at an earlier load"
            if digest in self.by_digest
            else "not measured yet: --triton-memory-per-load"
        )
        with self._lock:
            self.used = tree.rss
            self._refresh(tree)
            others = [v for k, v in self._in_flight.items() if k != name]
            pending = sum(b for _, b in others)
            room = limit - rules.reserve - tree.rss - pending
            if need > room:
                raise HostMemoryExhaustedError(
                    f"model {model_id!r} of pod {pod} does not fit in Triton's host memory: it "
                    f"needs {need / MIB:.0f} MiB ({measured}), and Triton holds "
                    f"{tree.rss / MIB:.0f} MiB, loads under way {pending / MIB:.0f} MiB, of its "
                    f"{limit / MIB:.0f} MiB limit less {rules.reserve / MIB:.0f} MiB kept "
                    f"(--triton-memory-reserve); loading it would let the kernel OOM-kill Triton "
                    f"and every model in it. The pod stays unloaded: delete it so the binder "
                    f"places it again, or raise Triton's memory limit (docs/deploy.md, Node pod "
                    f"memory)",
                    event_reason=EVENT_REASON,
                )
            held = self._held(namespace, name)
            held += sum(b for ns, b in others if ns == namespace)
            share = rules.share(limit)
            if held + need > share:
                raise HostMemoryExhaustedError(
                    f"model {model_id!r} of pod {pod} does not fit in its namespace's share of "
                    f"Triton's host memory: it needs {need / MIB:.0f} MiB ({measured}; at least "
                    f"--triton-memory-floor), and namespace {namespace} already holds "
                    f"{held / MIB:.0f} MiB of the {share / MIB:.0f} MiB each namespace may hold "
                    f"on this node (--triton-memory-namespace-percent of Triton's limit less "
                    f"--triton-memory-reserve). The pod stays unloaded: unload one of the "
                    f"namespace's models on this node, or delete the pod so the binder places it "
                    f"again",
                    event_reason=EVENT_REASON,
                )
            if self._in_flight.keys() - {name}:
                self._overlapped.update(self._in_flight.keys() | {name})
            self._in_flight[name] = (namespace, need)
        return Admitted(name, digest, tree, need, namespace, self._wall())

    def _held(self, namespace: str, but: str) -> int:
        """What a namespace's loaded models are billed, each at least the floor, but `but`'s."""
        floor = self.rules.floor
        return sum(
            max(c.bytes, floor)
            for k, c in self._charged.items()
            if c.namespace == namespace and k != but
        )

    def _refresh(self, tree: TritonTree) -> None:
        """What the models that run apart hold now: their own processes are theirs alone."""
        for name, charge in self._charged.items():
            if charge.apart:
                charge.own = tree.models.get(name, 0)

    def finished(self, admitted: Admitted | None, loaded: bool) -> None:
        """The load is over; measure it when it loaded. It is billed what its own processes hold,
        and the growth of Triton's own process across it only when no other load, unload or
        model's request shared its window (a neighbour's request may have grown Triton
        meanwhile); until that is known it is billed what no neighbour could have inflated."""
        if admitted is None:
            return
        name = admitted.name
        after = self._processes.tree() if loaded else None
        ended = self._wall()
        with self._lock:
            self._in_flight.pop(name, None)
            shared = name in self._overlapped
            self._overlapped.discard(name)
            # Its end falls in the windows of the loads still under way.
            self._overlapped.update(self._in_flight)
            if after is None:
                return
            self.used = after.rss
        quiet = False if shared else self._quiet(name, admitted.started, ended)
        apart = name in after.models
        own = after.models.get(name, 0)
        grown = max(after.own - admitted.before.own, 0)
        doubtful = 0 if apart else min(grown, admitted.need)
        charge = Charge(
            admitted.namespace,
            own,
            apart,
            grown if quiet else doubtful,
            sure=grown,
            digest=admitted.digest,
            ended=ended if quiet is None else 0.0,
            started=admitted.started,
        )
        with self._lock:
            self._charged[name] = charge
            if quiet:
                self._remember(admitted.digest, charge.bytes)
        how = {
            True: "its window was quiet",
            False: "its window was not found quiet (another load, unload or model's request may "
            "have shared it), so Triton's own growth is not all billed to it",
            None: "whether its window was quiet is not known yet",
        }[quiet]
        log.info(
            "Model %s took %d bytes of host memory to load (its own processes %d, Triton's own "
            "process grew by %d; %s); it is billed %d (Triton now holds %d).",
            name,
            own + grown,
            own,
            grown,
            how,
            charge.bytes,
            after.rss,
        )

    def _remember(self, digest: str, figure: int) -> None:
        if len(self.by_digest) >= REMEMBERED:
            self.by_digest.clear()  # figures are measured again at the next loads
        self.by_digest[digest] = figure

    def over_share(self) -> list[OverShare]:
        """The models to unload because their namespace holds more than its share by more than
        the floor (its models' own processes grew since their loads): of each such namespace,
        its models that run apart, the largest first, until the rest is within its share. Only
        figures no other tenant can inflate are read: its models' own processes, and Triton's
        growth across a quiet load. Reads Triton's processes now."""
        limit = self.limit()
        if limit is None:
            return []
        self.settle()  # a window found quiet since bills its load Triton's growth
        tree = self._processes.tree()
        if tree is None:
            return []
        share = self.rules.share(limit)
        floor = self.rules.floor
        found = []
        with self._lock:
            self.used = tree.rss
            self._refresh(tree)
            namespaces = {c.namespace for c in self._charged.values()}
            for namespace in sorted(namespaces):
                held = self._held(namespace, "")
                if held <= share + floor:
                    continue
                apart = sorted(
                    (c.bytes, name)
                    for name, c in self._charged.items()
                    if c.namespace == namespace and c.apart
                )
                left = held
                while apart and left > share:
                    figure, name = apart.pop()
                    found.append(OverShare(name, namespace, figure, held, share))
                    left -= max(figure, floor)
        return found

    def settle(self) -> None:
        """Bill the loads whose window is now found quiet Triton's growth across it (each
        admission and each `over_share` does this first)."""
        with self._lock:
            open_ = [(k, c) for k, c in self._charged.items() if c.ended]
        now = self._wall()
        for name, charge in open_:
            quiet = self._quiet(name, charge.started, charge.ended)
            with self._lock:
                if self._charged.get(name) is not charge:
                    continue  # unloaded meanwhile
                if quiet is None and now - charge.ended < SETTLE_SECONDS:
                    continue
                charge.ended = 0.0
                if quiet:
                    charge.triton = charge.sure
                    self._remember(charge.digest, charge.bytes)

    def used_bytes(self) -> int:
        """Triton's resident bytes at the last reading."""
        return self.used

    def models(self) -> dict[str, int]:
        """Name in Triton -> bytes it is billed (its own processes as last read, and what of
        Triton's growth across its load is its)."""
        with self._lock:
            return {name: charge.bytes for name, charge in self._charged.items()}

    def forget(self, name: str) -> None:
        """The model is unloaded: it no longer counts in the metric nor its namespace's share."""
        with self._lock:
            self._charged.pop(name, None)
            # What it freed fell in the windows of the loads under way.
            self._overlapped.update(self._in_flight)
