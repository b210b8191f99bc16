"""The gateway's witness records of Triton's deaths: which callers had requests at Triton then.

The node gateway sees every request that reaches Triton; the agent sees Triton exit. When the
gateway's own connection to Triton drops and Triton refuses a new one, the gateway writes a
record ("at T, Triton went away with these callers' requests in flight") to this file, in a
volume the agent reads (`--crash-witness-file` of both; by default beside the caller table,
`common.callers`); the agent, which tells an unexpected exit of Triton apart from a dropped
connection, reads the records near the exit and counts the suspects (`agent.status.requestcrash`).
The file is JSON, replaced whole by a rename and bounded to the last `MAX_RECORDS` records, so a
reader sees a whole file and a crash loop cannot grow it. What it must not do: decide who is a
suspect (the gateway's `gateway.witness`) or what a record proves (the agent's); this module only
says what a record is and moves records to and from disk.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.atomicfile import read_file, replace_file

FORMAT = "tritonshare.io/crash-witness/v1"
FILE_NAME = "crash-witness.json"
"""The file's name, in the caller table's directory: both sides derive it from the table's path."""
MAX_RECORDS = 32
"""Records kept (the newest): the agent reads them within seconds of each exit."""

BESIDE_SECONDS = 2.0
"""Every pod that sent a request within this long before Triton's death is named in the record
(`proxy.gateway.witness`): a watched load begins only once the pods it holds have sent nothing
for this long (`agent.models.probationhold`)."""


class WitnessError(ValueError):
    """The witness file is unreadable; the message says why."""


@dataclass(frozen=True, slots=True)
class Suspect:
    """One caller that had a request at Triton when it went away."""

    pod: str
    """namespace/name, as the caller table names the pod."""
    uid: str
    address: str
    model_id: str
    in_flight: int
    """Its requests at Triton then (those that failed with it included); 0: it sent the last
    request before Triton went away, none in flight."""


@dataclass(frozen=True, slots=True)
class Witness:
    """Triton went away at `at` (Unix seconds) with `suspects`' requests at it."""

    at: float
    suspects: tuple[Suspect, ...]


def path_beside(caller_table: Path) -> Path:
    """The witness file of the gateway that reads `caller_table`."""
    return caller_table.with_name(FILE_NAME)


def encode(records: list[Witness]) -> bytes:
    document = {
        "format": FORMAT,
        "records": [
            {
                "at": w.at,
                "suspects": [
                    {
                        "pod": s.pod,
                        "uid": s.uid,
                        "address": s.address,
                        "modelId": s.model_id,
                        "inFlight": s.in_flight,
                    }
                    for s in w.suspects
                ],
            }
            for w in records[-MAX_RECORDS:]
        ],
    }
    return json.dumps(document, indent=1).encode()


def decode(data: bytes) -> list[Witness]:
    """The records in `data`, oldest first; raises WitnessError when it is not such a file."""
    try:
        document: Any = json.loads(data)
        if not isinstance(document, dict) or document.get("format") != FORMAT:
            raise WitnessError(f"not a crash witness file (format is not {FORMAT!r})")
        return [
            Witness(
                float(item["at"]),
                tuple(
                    Suspect(
                        str(s["pod"]),
                        str(s["uid"]),
                        str(s["address"]),
                        str(s["modelId"]),
                        int(s["inFlight"]),
                    )
                    for s in item["suspects"]
                ),
            )
            for item in document["records"]
        ]
    except (ValueError, KeyError, TypeError) as e:
        if isinstance(e, WitnessError):
            raise
        raise WitnessError(f"the crash witness file is malformed ({e})") from e


def write_witnesses(path: Path, records: list[Witness]) -> None:
    """Replace the file at `path` with the newest `MAX_RECORDS` of `records` in one rename."""
    replace_file(path, encode(records), ".witness-")


def read_witnesses(path: Path) -> list[Witness]:
    """The records at `path`, oldest first ([] when there is no file yet)."""
    data = read_file(path, "crash witness file", WitnessError, None)
    return [] if data is None else decode(data)
