"""The crash markers on disk: one file for each load under way, synced before it reaches Triton.

A marker (`<name>.loading` in the state directory) says which files a load of the model `name`
sends to Triton (their manifest digest), for which pod, to which Triton process, when it was sent
and when Triton answered it READY. `MarkerFiles` writes, rewrites (finished), removes and reads
back the files, and only that: what a marker left over means, and what is counted for it, is
decided by `agent.quarantine.crashledger.CrashLedger`. A marker that cannot be read names no load
to count, so it is removed with a warning. The file is the marker's fields as JSON; the fields
added since the first have defaults, so an upgraded agent reads the markers an older one wrote.

`write_durably` is how the ledger writes each of its files (the markers and `crashes.json`): to
a temporary file, synced, then renamed over the old one, so an agent killed while writing leaves
the old file or the new one, never half of one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger(__name__)

MARKER_SUFFIX = ".loading"


@dataclass(frozen=True)
class Marker:
    """A load under way, as written before it reached Triton."""

    name: str
    """The model's name in Triton."""
    digest: str
    model_id: str
    pod: str
    """namespace/name of the pod it was loaded for."""
    finished_at: float = 0.0
    """When Triton answered the load READY (Unix seconds); 0 while it is in flight."""
    started_at: float = 0.0
    """When the load was sent to Triton (Unix seconds); 0: not known (an older marker)."""
    restore: bool = False
    """A reload of what Triton held before it restarted: no change, so no evidence against
    another party at an exit (`CrashLedger.loads_at`), and counted only when nothing else
    explains it."""
    trial: bool = False
    """A suspect's load with probationers held through its settling window
    (`agent.models.probationhold`): requests at Triton beside it are not a probationer's, so sharing
    a second exit with them does not make the exit theirs (`CrashLedger.shared_before`)."""
    triton: str = ""
    """The Triton process the load was sent to (`CrashLedger.triton`): an exit that leaves the
    marker over is that process's, so the markers of one exit name the same one and it is
    counted once (`exit`). "" (an older marker): its own exit."""

    @property
    def exit(self) -> str | None:
        """The exit that leaves this marker over, as the counts know it (None: no name, an exit
        of its own)."""
        return self.triton or None

    def at_exit(self, first_down: float, settle_seconds: float, slack: float) -> bool:
        """Whether this load was in flight, or settling, when Triton was found gone at
        `first_down` (Unix seconds, `slack` for the clocks and the sentinel's delay)."""
        if self.started_at > first_down + slack:
            return False  # sent to the Triton that came back
        return not self.finished_at or first_down <= self.finished_at + settle_seconds + slack


class MarkerFiles:
    """The crash markers in `directory`, by the model's name in Triton."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def write(self, marker: Marker) -> None:
        """Write `marker` durably (a new one, or the same load's, finished)."""
        write_durably(self._path(marker.name), asdict(marker))

    def remove(self, name: str) -> None:
        """Remove the marker of `name`, if there is one."""
        with contextlib.suppress(FileNotFoundError):
            self._path(name).unlink()

    def read(self) -> dict[str, Marker]:
        """Every marker on disk, by name in Triton (unreadable ones are removed)."""
        found = {}
        for path in sorted(self.directory.glob(f"*{MARKER_SUFFIX}")):
            try:
                data = json.loads(path.read_text())
                marker = Marker(
                    str(data["name"]),
                    str(data["digest"]),
                    str(data["model_id"]),
                    str(data["pod"]),
                    float(data.get("finished_at", 0.0)),
                    float(data.get("started_at", 0.0)),
                    bool(data.get("restore", False)),
                    bool(data.get("trial", False)),
                    str(data.get("triton", "")),
                )
            except (OSError, ValueError, KeyError, TypeError) as e:
                log.warning("The crash marker %s is unreadable (%s): removing it.", path, e)
                with contextlib.suppress(OSError):
                    path.unlink()
                continue
            found[marker.name] = marker
        return found

    def _path(self, name: str) -> Path:
        return self.directory / f"{name}{MARKER_SUFFIX}"


def write_durably(path: Path, document: object) -> None:
    """Write `document` as JSON to `path`: to a temporary file, synced, then renamed."""
    temporary = path.with_name(path.name + ".tmp")
    with temporary.open("w") as f:
        json.dump(document, f)
        f.flush()
        os.fsync(f.fileno())
    temporary.replace(path)
