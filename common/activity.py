"""The node gateway's activity table: which of the node's models are serving, and when last.

The gateway sees every request to the node's Triton; it writes, per model (by its name in
Triton), the requests in flight or queued for it and when the last one began or ended. The agent
reads the table when it picks idle on-demand models to put to sleep for another's load
(`agent.models.eviction`), and before a watched load, to see the probationers it holds drained
(`agent.models.probationhold`). Both run in the node pod and share the file through the volume of
the caller table (`common.callers`), which only they mount. The file is JSON, replaced whole by a
rename, and rewritten at least every `HEARTBEAT_SECONDS` (at most once a second while it
changes), so its `writtenAt` tells the agent the gateway is alive: past the agent's bound the
table is stale and no model may be evicted (fail closed). What it must not do: count requests
(that is the gateway's) or decide evictions (the agent's); this module only says what a table is
and moves it to and from disk.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from common.atomicfile import read_file, replace_file

FORMAT = "tritonshare.io/activity/v1"
HEARTBEAT_SECONDS = 2.0
"""The longest the gateway leaves an unchanged table unwritten."""


class ActivityTableError(ValueError):
    """The table file is missing or unreadable; the message says which and what to do."""


@dataclass(frozen=True, slots=True)
class Activity:
    """One model's requests as the gateway saw them."""

    in_flight: int = 0
    """Requests at Triton or waiting at the gateway for a slot."""
    last_used: float = 0.0
    """Unix seconds when a request last began or ended (0: none since the gateway started)."""
    at_triton: int = 0
    """Of `in_flight`, the requests at Triton now (0 in tables of gateways before the field)."""
    held: bool = False
    """The gateway holds the model's new requests (`common.callers.Caller.held`)."""
    restoring: bool = False
    """The gateway holds the model's new requests until Triton has it again after an exit; what
    such a hold lets go is not held again (`proxy.policy.limiter.Limiter.acquire`)."""


@dataclass(frozen=True, slots=True)
class ActivityTable:
    """Every model's activity on one node, and when the gateway wrote it (Unix seconds)."""

    written_at: float
    models: Mapping[str, Activity] = field(default_factory=dict)


def encode(table: ActivityTable) -> bytes:
    document = {
        "format": FORMAT,
        "writtenAt": table.written_at,
        "models": {
            name: {
                "inFlight": a.in_flight,
                "lastUsed": a.last_used,
                "atTriton": a.at_triton,
                **({"held": True} if a.held else {}),
                **({"restoring": True} if a.restoring else {}),
            }
            for name, a in sorted(table.models.items())
        },
    }
    return json.dumps(document, separators=(",", ":")).encode()


def decode(data: bytes) -> ActivityTable:
    """The table in `data`; ActivityTableError when it is not a table of this format."""
    try:
        document = json.loads(data)
        if not isinstance(document, dict) or document.get("format") != FORMAT:
            raise ActivityTableError(f"not an activity table (format is not {FORMAT!r})")
        models = {}
        for name, entry in dict(document["models"]).items():
            in_flight = entry["inFlight"]
            if not isinstance(in_flight, int) or isinstance(in_flight, bool) or in_flight < 0:
                raise ActivityTableError(f"inFlight {in_flight!r} of {name!r} is not a count")
            at_triton = entry.get("atTriton", 0)
            if not isinstance(at_triton, int) or isinstance(at_triton, bool) or at_triton < 0:
                raise ActivityTableError(f"atTriton {at_triton!r} of {name!r} is not a count")
            held = entry.get("held", False)
            if not isinstance(held, bool):
                raise ActivityTableError(f"held {held!r} of {name!r} is not true or false")
            restoring = entry.get("restoring", False)
            if not isinstance(restoring, bool):
                raise ActivityTableError(
                    f"restoring {restoring!r} of {name!r} is not true or false"
                )
            models[str(name)] = Activity(
                in_flight, float(entry["lastUsed"]), at_triton, held, restoring
            )
        return ActivityTable(float(document["writtenAt"]), models)
    except (ValueError, KeyError, TypeError) as e:
        if isinstance(e, ActivityTableError):
            raise
        raise ActivityTableError(f"the activity table is malformed ({e})") from e


def write_table(path: Path, table: ActivityTable) -> None:
    """Replace the file at `path` with `table` in one rename."""
    replace_file(path, encode(table), ".activity-")


def read_table(path: Path) -> ActivityTable:
    """The table at `path`; ActivityTableError when it is missing or unreadable."""
    hint = (
        "the node gateway writes it (its --activity-table); is the gateway running and is the "
        "volume shared with the agent?"
    )
    data = read_file(path, "activity table", ActivityTableError, hint)
    assert data is not None  # a missing file raised
    return decode(data)


def freshness_problem(table: ActivityTable, now: float, max_age: float) -> str:
    """Why the table may not be acted on at `now` ("" when it may): older than `max_age`."""
    age = now - table.written_at
    if age > max_age:
        return (
            f"the node gateway's activity table is {age:.0f} s old (over {max_age:g} s, "
            f"--activity-max-age-seconds), so the agent cannot tell which models are serving; "
            f"check the node pod's gateway"
        )
    return ""
