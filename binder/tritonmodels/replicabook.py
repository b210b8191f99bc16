"""The replica book: what the TritonModel controller keeps of its models' replicas between turns,
in one place, changed only through named transitions (as kube-scheduler's cache has `AssumePod`
and `ForgetPod`).

- **Drains** (`drain`, `undrain`): a replica leaving (scaled away, preempted, on old files) stays
  charged, out of its Service and listed on its host as draining, until its host no longer has it
  loaded or its bound passes. The book is the only writer of the ledger's `draining`, which keeps
  the cache from freeing such a replica.
- **Parks** (`park`, `unpark`): a model at zero replicas is parked on one host of its namespace,
  which holds its requests (`binder.autoscaler.parkedmodels`).
- **Stand-ins** (`ask_stand_in`, `release_stand_in`): a model one host alone serves (or parks)
  wants one replica more elsewhere while that host is replaced (`binder.tritonmodels.hostreplace`).
- **Host refusals** (`refuse_host`, `accept_host`): why the API server refuses a namespace's host
  on a node (its models' Ready condition says so).

The placer and the host replacements write it; serving, the roll and the host writer read it
through `ReplicaView`. Pure: no I/O; the clock is given.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Protocol

from binder.cluster.ledger import Ledger

Where = tuple[str, str]
"""(node, storage Secret) of a namespace's host."""


class ReplicaView(Protocol):
    """What serving, the roll and the host writer read of the book."""

    def draining(self, rid: str) -> bool: ...

    def drains_of(self, model_uid: str) -> list[str]: ...

    def parked_at(self, model_uid: str) -> str | None: ...

    def stand_in(self, model_uid: str) -> str | None: ...

    def host_refused(self, namespace: str, where: Where) -> str | None: ...


class ReplicaBook:
    """Drains, parks, stand-ins and host refusals of the TritonModels' replicas."""

    def __init__(self, ledger: Ledger, *, drain_seconds: float, clock: Callable[[], float]):
        self._ledger = ledger
        self._drain_seconds = drain_seconds
        self._clock = clock
        self._drains: dict[str, dict[str, float]] = {}
        """Model uid -> replica uid -> when its drain ends at the latest (`clock`)."""
        self._parked: dict[str, str] = {}
        """Model uid -> the node of the host it is parked on at zero replicas."""
        self._stand_ins: dict[str, str] = {}
        """Model uid -> the node whose host a stand-in replica of it serves for."""
        self._refused: dict[tuple[str, Where], str] = {}
        """(namespace, where) -> why the API server refuses that host now."""

    # Drains.

    def drain(self, rid: str) -> None:
        """Replica `rid` begins to drain, for at most the drain's bound from now."""
        model_uid = rid.rpartition("/")[0]
        self._drains.setdefault(model_uid, {})[rid] = self._clock() + self._drain_seconds
        self._ledger.draining.add(rid)

    def undrain(self, rid: str) -> None:
        """Replica `rid` no longer drains (freed, taken back, or gone)."""
        model_uid = rid.rpartition("/")[0]
        drains = self._drains.get(model_uid)
        if drains is not None:
            drains.pop(rid, None)
            if not drains:
                del self._drains[model_uid]
        self._ledger.draining.discard(rid)

    def draining(self, rid: str) -> bool:
        return rid in self._drains.get(rid.rpartition("/")[0], ())

    def drain_ends(self, rid: str) -> float:
        """When the drain of `rid` ends at the latest (`clock`); it must be draining."""
        return self._drains[rid.rpartition("/")[0]][rid]

    def drains_of(self, model_uid: str) -> list[str]:
        """The model's replicas draining."""
        return list(self._drains.get(model_uid, ()))

    def draining_models(self) -> Iterator[str]:
        """The models with a replica draining."""
        return iter(list(self._drains))

    # Parks.

    def park(self, model_uid: str, node: str) -> bool:
        """The model is parked on its namespace's host on `node`; whether that is new."""
        if self._parked.get(model_uid) == node:
            return False
        self._parked[model_uid] = node
        return True

    def unpark(self, model_uid: str) -> None:
        self._parked.pop(model_uid, None)

    def parked_at(self, model_uid: str) -> str | None:
        return self._parked.get(model_uid)

    # Stand-ins.

    def ask_stand_in(self, model_uid: str, node: str) -> None:
        """The model wants a stand-in replica while the host on `node` is replaced."""
        self._stand_ins[model_uid] = node

    def release_stand_in(self, model_uid: str) -> None:
        self._stand_ins.pop(model_uid, None)

    def stand_in(self, model_uid: str) -> str | None:
        """The node whose host the model's stand-in serves for (None: it has none)."""
        return self._stand_ins.get(model_uid)

    @property
    def stand_ins(self) -> Mapping[str, str]:
        """Model uid -> the node its stand-in serves for (read-only)."""
        return dict(self._stand_ins)

    # Host refusals.

    def refuse_host(self, namespace: str, where: Where, why: str) -> bool:
        """The API server refuses the namespace's host at `where`; whether the words are new."""
        if self._refused.get((namespace, where)) == why:
            return False
        self._refused[(namespace, where)] = why
        return True

    def accept_host(self, namespace: str, where: Where) -> bool:
        """The host is created, or no longer wanted; whether it was refused."""
        return self._refused.pop((namespace, where), None) is not None

    def host_refused(self, namespace: str, where: Where) -> str | None:
        return self._refused.get((namespace, where))

    def refused_hosts(self, namespace: str) -> list[Where]:
        """Where the namespace's hosts are refused now."""
        return [w for n, w in self._refused if n == namespace]

    # A model gone.

    def forget(self, model_uid: str) -> None:
        """The model is deleted: its drains end, its park and stand-in go."""
        for rid in self.drains_of(model_uid):
            self.undrain(rid)
        self.unpark(model_uid)
        self.release_stand_in(model_uid)
