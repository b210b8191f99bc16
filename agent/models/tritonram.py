"""Triton's host memory, admitted like its GPU memory: its container's limit, what each model's
files are measured to take at load, and whether a load still fits.

The limit is `--triton-memory-limit` (set from the downward API's `limits.memory` of Triton's
container), else the `memory.max` of Triton's cgroup where the agent can read it. Triton's use is
the resident memory of its process tree (`agent.gpus.processes`), read before and after each load;
the growth is that model's figure, kept per manifest digest, so every later load of the same files
is admitted on it. A load fits when Triton's use now, the loads admitted and still under way, and
this load's figure (until measured `--triton-memory-per-load`; never less than its files) stay
under the limit minus `--triton-memory-reserve` (requests in flight, Triton's own growth).
The room left for models is shared by namespace: a namespace's loaded models (each charged its
measured figure, at least `--triton-memory-floor`, so a model of one byte costs what a load
really costs) and its loads under way stay within `--triton-memory-namespace-percent` of it, so
no namespace can fill Triton before another loads (the namespace is the first part of the pod's
key, a replica's too). Otherwise it is refused with `HostMemoryExhaustedError` before Triton sees
it: a load that would take the container past its limit gets the OOM killer, which ends every
tenant's model at once.
With no limit or no Triton PID nothing is admitted here. Blocking reads: callers run it off the
event loop. It must not call Triton.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from agent.errors import HostMemoryExhaustedError
from agent.gpus.processes import TritonProcesses, TritonTree
from common.hosted import HOST_MEMORY_REASON

log = logging.getLogger(__name__)

MIB = 1024 * 1024
EVENT_REASON = HOST_MEMORY_REASON
REMEMBERED = 10_000


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


class HostMemory:
    """Admits loads against Triton's memory limit and measures them (thread-safe)."""

    def __init__(self, processes: TritonProcesses, rules: HostMemoryRules) -> None:
        self._processes = processes
        self.rules = rules
        self._lock = threading.Lock()
        self._in_flight: dict[str, tuple[str, int]] = {}
        """Name in Triton -> (namespace, bytes admitted) of the loads under way."""
        self._charged: dict[str, tuple[str, int]] = {}
        """Name in Triton -> (namespace, bytes charged: its figure, at least the floor)."""
        self.by_digest: dict[str, int] = {}
        """Manifest digest -> bytes a load of those files was measured to take."""
        self.by_model: dict[str, int] = {}
        """Name in Triton -> bytes its load was measured to take (for the metric)."""
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
            held = sum(b for k, (ns, b) in self._charged.items() if ns == namespace and k != name)
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
            self._in_flight[name] = (namespace, need)
        return Admitted(name, digest, tree, need, namespace)

    def finished(self, admitted: Admitted | None, loaded: bool) -> None:
        """The load is over; measure its growth when it loaded."""
        if admitted is None:
            return
        after = self._processes.tree() if loaded else None
        with self._lock:
            self._in_flight.pop(admitted.name, None)
            if after is None:
                return
            self.used = after.rss
            grown = max(after.rss - admitted.before.rss, 0)
            self.by_model[admitted.name] = grown
            self._charged[admitted.name] = (admitted.namespace, max(grown, self.rules.floor))
            if len(self.by_digest) >= REMEMBERED:
                self.by_digest.clear()  # figures are measured again at the next loads
            self.by_digest[admitted.digest] = grown
        log.info(
            "Model %s took %d bytes of host memory to load (Triton now holds %d).",
            admitted.name,
            grown,
            after.rss,
        )

    def used_bytes(self) -> int:
        """Triton's resident bytes at the last reading."""
        return self.used

    def models(self) -> dict[str, int]:
        """Name in Triton -> bytes its load was measured to take."""
        with self._lock:
            return dict(self.by_model)

    def forget(self, name: str) -> None:
        """The model is unloaded: it no longer counts in the metric nor its namespace's share."""
        with self._lock:
            self.by_model.pop(name, None)
            self._charged.pop(name, None)
