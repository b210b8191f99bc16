"""The node gateway's caller table: which pod address may reach which model on this node.

The agent writes it (it watches the node's pods, verifies each proof of placement and knows which
pod owns each model id); the gateway reads it and lets a connection that presents the row's
caller key (`key`, its digest: `common.callerkeys`), or that comes from `address`, reach only
`model_id`. Both run in the node pod and share the file through a volume only they mount, so
nothing a tenant writes reaches it. The file is JSON, replaced whole by a rename (a reader sees the
old table or the new one), and rewritten at least every few seconds even when nothing changed, so
its `written_at` tells the gateway the agent is alive: past the gateway's bound the table is stale,
and the gateway serves only the callers of the last table it saw fresh, for a bounded grace, then
none (fail closed). A model host (`common.hosted`) serves several TritonModel replicas from one
address: it has one row per replica, all with its address and `pod`, each with its own model, uid
(`<model uid>/<ordinal>`) and private name; a model pod has one. A host's row may also name
the host's other replicas of its model (`spread`): the gateway spreads the model's requests over
them all. An agent or gateway of the version before reads and writes no `spread`: its tables
reach the gateway as rows of one replica, and it reaches the row's own replica only. What it must
not do: decide who is a caller (that is `agent.pods.callertable`); this module only says what a
table is and moves it to and from disk.
"""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from common.atomicfile import read_file, replace_file
from common.contract import ContractError, validate_model_id

FORMAT = "tritonshare.io/callers/v1"
_KEY_RE = re.compile(r"[0-9a-f]{64}")

Spare = tuple[str, str]
"""Another replica of a host's row's model: its name in Triton and its uid."""


class CallerTableError(ValueError):
    """The table file is missing or unreadable; the message says which and what to do."""


@dataclass(frozen=True, slots=True)
class Caller:
    """One pod that may call the gateway: its address, its model and who it is."""

    address: str
    """The pod's IP (status.podIP), as the gateway sees it as a connection's source."""
    model_id: str
    pod: str
    """namespace/name, for logs and metrics."""
    uid: str
    concurrency: int = 0
    """The in-flight limit the pod's proxy declares (`--container-concurrency`); 0: none. The
    gateway's per-pod limit follows it, up to the gateway's own ceiling."""
    triton_name: str = ""
    """The name the pod's model has in Triton, private to the pod: the gateway maps
    `model_id` in each request to it and back in each answer. Empty: the same as `model_id`
    (models installed before private names, and tables of agents before the field)."""
    quarantined: str = ""
    """Why the pod's requests are refused (its requests coincided with too many of Triton's
    unexpected exits, `agent.quarantine.crashledger`), in words for the pod; empty: it is served."""
    probation: bool = False
    """Its requests were at Triton with another pod's when Triton exited
    (`agent.quarantine.suspects`): the gateway lets them reach Triton only while no other
    probationer's are there."""
    held: bool = False
    """On probation while a load the agent watches is in flight or just ended, or any pod while
    a suspected file's trial is in flight (`agent.models.probationhold`): the gateway holds its
    new requests (each a bounded time), so that an exit of Triton then is the load's alone."""
    trial: bool = False
    """Held on probation while the load of a model under suspicion is in flight or settles (its
    trial, `agent.models.probationhold`): the gateway refuses the pod's new requests instead of
    holding them, so that an exit then is the suspect's alone, however late it comes."""
    spread: tuple[Spare, ...] = ()
    """A model host's other replicas of the model, loaded and not draining, as (name in Triton,
    uid), when this row's own (the preferred) is loaded and not draining too: the gateway sends
    each request to the one of them all with the fewest held. Empty: this row's replica alone."""
    key: str = ""
    """The SHA-256 (hex) of the pod's caller key (`common.callerkeys.digest`), the same on each
    of a pod's rows; empty: the pod is known by its address alone (tables of agents before keys)."""
    stopping: str = ""
    """Why the pod leaves its Service (the node pod stops, and its model has a ready replica on
    another node: `agent.status.stopping`), in words for the pod; empty: it stays. The gateway
    answers its readiness calls not ready, and serves all its other calls as before."""

    def alike(self, other: Caller) -> bool:
        """Whether `other` is this row but for its probation, hold and stop (what the agent's
        crash blame and the node pod's stop change, with no effect on the pod's connections)."""
        return (
            replace(
                self,
                probation=other.probation,
                held=other.held,
                trial=other.trial,
                stopping=other.stopping,
            )
            == other
        )

    @property
    def namespace(self) -> str:
        """The pod's namespace: what the node's shared budgets are split by first."""
        return self.pod.partition("/")[0]

    @property
    def name_in_triton(self) -> str:
        """The model's name in Triton: `triton_name`, or the public `model_id` when none."""
        return self.triton_name or self.model_id

    def replicas(self) -> tuple[Caller, ...]:
        """The row of each replica its requests spread over, this row's own first: the same
        pod, model, limit and standing, each with its own name in Triton and uid."""
        others = (replace(self, triton_name=n, uid=u, spread=()) for n, u in self.spread)
        return (replace(self, spread=()), *others)

    @property
    def replica(self) -> bool:
        """A TritonModel replica served by a model host (its uid, `<model uid>/<ordinal>`, has
        a slash, which no pod's uid has), rather than a model pod's own model."""
        return "/" in self.uid


@dataclass(frozen=True, slots=True)
class CallerTable:
    """Every caller of one node, and when the agent last wrote the table (Unix seconds)."""

    node: str
    written_at: float
    callers: tuple[Caller, ...]

    def by_address(self) -> dict[str, dict[str, Caller]]:
        """Per address, the caller's rows by model id (a model pod's one, a host's several)."""
        rows: dict[str, dict[str, Caller]] = {}
        for c in self.callers:
            rows.setdefault(c.address, {})[c.model_id] = c
        return rows


def encode(table: CallerTable) -> bytes:
    """The file's bytes for `table`."""
    document = {
        "format": FORMAT,
        "node": table.node,
        "writtenAt": table.written_at,
        "callers": [
            {
                "address": c.address,
                "modelId": c.model_id,
                "pod": c.pod,
                "uid": c.uid,
                "concurrency": c.concurrency,
                **({"tritonName": c.triton_name} if c.triton_name else {}),
                **({"quarantined": c.quarantined} if c.quarantined else {}),
                **({"probation": True} if c.probation else {}),
                **({"held": True} if c.held else {}),
                **({"trial": True} if c.trial else {}),
                **(
                    {"spread": [{"tritonName": n, "uid": u} for n, u in c.spread]}
                    if c.spread
                    else {}
                ),
                **({"key": c.key} if c.key else {}),
                **({"stopping": c.stopping} if c.stopping else {}),
            }
            for c in sorted(table.callers, key=lambda c: (c.address, c.model_id))
        ],
    }
    return json.dumps(document, indent=1).encode()


def decode(data: bytes) -> CallerTable:
    """The table in `data`; raises CallerTableError when it is not a table of this format."""
    try:
        document = json.loads(data)
        if not isinstance(document, dict) or document.get("format") != FORMAT:
            raise CallerTableError(f"not a caller table (format is not {FORMAT!r})")
        callers = tuple(_caller(entry) for entry in document["callers"])
        _check_rows(callers)
        return CallerTable(str(document["node"]), float(document["writtenAt"]), callers)
    except (ValueError, KeyError, TypeError, ContractError) as e:
        if isinstance(e, CallerTableError):
            raise
        raise CallerTableError(f"the caller table is malformed ({e})") from e


def _caller(entry: Any) -> Caller:
    if not isinstance(entry, dict):
        raise CallerTableError("a caller entry is not an object")
    address = str(entry["address"])
    try:
        canonical = str(ipaddress.ip_address(address))
    except ValueError as e:
        raise CallerTableError(f"caller address {address!r} is not an IP address") from e
    if canonical != address:
        raise CallerTableError(f"caller address {address!r} is not written canonically")
    # Tables of agents before the field existed have none: the gateway's default applies.
    concurrency = entry.get("concurrency", 0)
    if not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 0:
        raise CallerTableError(f"caller concurrency {concurrency!r} is not a whole number")
    # Absent in tables of agents before private names: the model's Triton name is its id.
    triton_name = entry.get("tritonName", "")
    if not isinstance(triton_name, str):
        raise CallerTableError(f"caller tritonName {triton_name!r} is not a string")
    if triton_name:
        validate_model_id(triton_name)
    quarantined = entry.get("quarantined", "")
    if not isinstance(quarantined, str):
        raise CallerTableError(f"caller quarantined {quarantined!r} is not a string")
    # Absent in tables of agents before probation: not on probation.
    probation = entry.get("probation", False)
    if not isinstance(probation, bool):
        raise CallerTableError(f"caller probation {probation!r} is not true or false")
    held = entry.get("held", False)
    if not isinstance(held, bool):
        raise CallerTableError(f"caller held {held!r} is not true or false")
    trial = entry.get("trial", False)
    if not isinstance(trial, bool):
        raise CallerTableError(f"caller trial {trial!r} is not true or false")
    # Absent in tables of agents before caller keys: known by address alone.
    key = entry.get("key", "")
    if not isinstance(key, str) or (key and not _KEY_RE.fullmatch(key)):
        raise CallerTableError(f"caller key {key!r} is not a SHA-256 digest in hex")
    # Absent in tables of agents before the node pod's stop drained model pods: it stays.
    stopping = entry.get("stopping", "")
    if not isinstance(stopping, str):
        raise CallerTableError(f"caller stopping {stopping!r} is not a string")
    model_id = validate_model_id(str(entry["modelId"]))
    return Caller(
        address,
        model_id,
        str(entry["pod"]),
        str(entry["uid"]),
        concurrency,
        triton_name,
        quarantined,
        probation,
        held,
        trial,
        _spread(entry.get("spread", []), triton_name or model_id),
        key,
        stopping,
    )


def _spread(value: Any, own: str) -> tuple[Spare, ...]:
    """A row's other replicas; absent in tables of agents before them: none."""
    if not isinstance(value, list):
        raise CallerTableError(f"caller spread {value!r} is not a list")
    spares: list[Spare] = []
    names = {own}
    for spare in value:
        if not isinstance(spare, dict):
            raise CallerTableError(f"a caller's spread replica {spare!r} is not an object")
        name, uid = spare.get("tritonName"), spare.get("uid")
        if not isinstance(name, str) or not isinstance(uid, str):
            raise CallerTableError(
                f"a caller's spread replica {spare!r} has no tritonName and uid strings"
            )
        validate_model_id(name)
        if name in names:
            raise CallerTableError(f"a caller names replica {name} twice in its spread")
        names.add(name)
        spares.append((name, uid))
    return tuple(spares)


def _check_rows(callers: tuple[Caller, ...]) -> None:
    """An address has several rows only as a model host does: one pod, one row per model."""
    seen: dict[str, Caller] = {}
    models: set[tuple[str, str]] = set()
    for c in callers:
        first = seen.setdefault(c.address, c)
        if first.pod != c.pod:
            raise CallerTableError(
                f"address {c.address} is given to two pods ({first.pod} and {c.pod}); an "
                "address names one pod: the agent leaves out an address several pods claim"
            )
        if first.key != c.key:
            raise CallerTableError(
                f"address {c.address} has rows with different keys; a pod has one key"
            )
        if (c.address, c.model_id) in models:
            raise CallerTableError(
                f"address {c.address} has two rows for model {c.model_id}; a pod has one row "
                "per model it serves"
            )
        models.add((c.address, c.model_id))


def write_table(path: Path, table: CallerTable) -> None:
    """Replace the file at `path` with `table` in one rename."""
    replace_file(path, encode(table), ".callers-")


def read_table(path: Path) -> CallerTable:
    """The table at `path`; raises CallerTableError when it is missing or unreadable."""
    hint = (
        "the node's agent writes it (--gateway-table); is the agent running and is the volume "
        "shared with the gateway?"
    )
    data = read_file(path, "caller table", CallerTableError, hint)
    assert data is not None  # a missing file raised
    return decode(data)
