"""Where a wake's time goes: each model's way from its held request to its first answer, phase by
phase, read from the simulated cluster's logs.

For each model woken at `started` (the requests' start, when the host's proxy holds them), the
first line after it of each step, in order:

- decision: the autoscaler's `TritonModel <ns>/<model> scales from 0` (binder's log);
- slot: the binder places the replica on the host, the host's loader takes one of its load
  slots for it and begins to install its files: the agent hears of the replica (`Model <model>
  of pod <ns>/<model>/<n> is named`, agent's log);
- install: its files installed, the host's loader asks the agent to load it (`Asking the agent
  to load`, the loader's log);
- queue: Triton begins the load (`loading: <name>:<version>`, Triton's log): the agent's
  parallel-load slot and its LoadModel call;
- load: Triton has loaded it (`successfully loaded`);
- ready: the agent says the host's replica is loaded (`loaded-<model>_<n>=True`);
- answer: the model's first answer (the client's clock).

Each phase is the time from the step before (the request, for decision) to its own step; a step
not found leaves its phase and the next one out for that model. `Breakdown.lines` prints p50,
p95 and max of each phase across the models.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from benchmarks.loadfloor import percentile

PHASES = ("decision", "slot", "install", "queue", "load", "ready", "answer")
"""The phases of a wake, in order (see the module docstring)."""

_PYTHON_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
_TRITON_TIME = re.compile(r"^[IWE](\d\d)(\d\d) (\d\d:\d\d:\d\d\.\d+) ")
_TRITON_NAME = re.compile(r"^(.+)-[0-9a-f]{24}$")
_DECIDED = re.compile(r"TritonModel [^/\s]+/(\S+) scales from 0: ")
_PLACED = re.compile(r"Model (\S+) of pod [^/\s]+/\S+/\d+ is named ")
_READY = re.compile(r"/loaded-(\S+)_\d+=True ")
_ASKED = re.compile(r"Asking the agent to load model (\S+) into Triton\.")
_TRITON_LOADING = re.compile(r'"loading: (\S+):\d+"')
_TRITON_LOADED = re.compile(r"successfully loaded '([^']+)'")


def python_time(line: str) -> float | None:
    """The epoch seconds of a line of the project's text logs (local time), None for another."""
    found = _PYTHON_TIME.match(line)
    if found is None:
        return None
    return datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()


def triton_time(line: str, year: int) -> float | None:
    """The epoch seconds of a line of Triton's log (`I1129 16:31:32.578885`, local time; the
    year is not in it), None for another."""
    found = _TRITON_TIME.match(line)
    if found is None:
        return None
    month, day, clock = found.groups()
    stamp = datetime.strptime(f"{year}-{month}-{day} {clock}", "%Y-%m-%d %H:%M:%S.%f")
    return stamp.timestamp()


def _model(triton_name: str) -> str:
    """The model of a name in Triton (`<model>-<24 hex digits>`)."""
    found = _TRITON_NAME.match(triton_name)
    return found.group(1) if found else triton_name


@dataclass(frozen=True)
class Breakdown:
    """Each model's seconds in each phase (a phase missing where its step was not found)."""

    models: Mapping[str, Mapping[str, float]]

    def seconds(self, phase: str) -> list[float]:
        return [spent[phase] for spent in self.models.values() if phase in spent]

    def lines(self) -> list[str]:
        said = [f"  phases of the wake across {len(self.models)} models (s): p50 / p95 / max"]
        for phase in PHASES:
            found = self.seconds(phase)
            if not found:
                said.append(f"    {phase:<9} not found in the logs")
                continue
            missing = len(self.models) - len(found)
            note = f" ({missing} not found)" if missing else ""
            said.append(
                f"    {phase:<9} {percentile(found, 0.5):6.2f} {percentile(found, 0.95):6.2f} "
                f"{max(found):6.2f}{note}"
            )
        return said


def steps(
    names: Sequence[str],
    started: float,
    binder: Iterable[str],
    agent: Iterable[str],
    loader: Iterable[str],
    triton: Iterable[str],
    year: int,
) -> dict[str, dict[str, float]]:
    """Each model's first time at or after `started` of each step but the answer, by the name of
    the phase it ends."""
    wanted = set(names)
    found: dict[str, dict[str, float]] = {name: {} for name in names}

    def mark(model: str, phase: str, at: float | None) -> None:
        if at is not None and at >= started and model in wanted:
            found[model].setdefault(phase, at)

    for line in binder:
        if decided := _DECIDED.search(line):
            mark(decided.group(1), "decision", python_time(line))
    for line in agent:
        if placed := _PLACED.search(line):
            mark(placed.group(1), "slot", python_time(line))
        elif ready := _READY.search(line):
            mark(ready.group(1), "ready", python_time(line))
    for line in loader:
        if asked := _ASKED.search(line):
            mark(asked.group(1), "install", python_time(line))
    for line in triton:
        if loading := _TRITON_LOADING.search(line):
            mark(_model(loading.group(1)), "queue", triton_time(line, year))
        elif loaded := _TRITON_LOADED.search(line):
            mark(_model(loaded.group(1)), "load", triton_time(line, year))
    return found


def breakdown(
    names: Sequence[str], started: float, firsts: Sequence[float], logs: Mapping[str, list[str]]
) -> Breakdown:
    """The phases of a wake of `names` begun at `started` (epoch seconds), whose first answers
    came `firsts` seconds after it, from `logs`' lines (keys binder, agent, loader, triton)."""
    year = datetime.fromtimestamp(started).year
    found = steps(
        names,
        started,
        logs.get("binder", []),
        logs.get("agent", []),
        logs.get("loader", []),
        logs.get("triton", []),
        year,
    )
    models: dict[str, dict[str, float]] = {}
    for name, first in zip(names, firsts, strict=True):
        at = {**found[name], "answer": started + first}
        spent: dict[str, float] = {}
        before: float | None = started
        for phase in PHASES:
            now = at.get(phase)
            if now is not None and before is not None:
                spent[phase] = now - before
            before = now
        models[name] = spent
    return Breakdown(models)


def read_logs(workdir: Path, node: str) -> dict[str, list[str]]:
    """The lines of a `sim.cluster.SimCluster`'s logs under `workdir` a breakdown reads: its
    binders', the agent's of `node`, its model hosts' loaders' and Triton's."""

    def lines(paths: Iterable[Path]) -> list[str]:
        return [
            line for path in sorted(paths) for line in path.read_text(errors="replace").splitlines()
        ]

    logs = workdir / "logs"
    return {
        "binder": lines(logs.glob("binder-*.log")),
        "agent": lines(logs.glob(f"agent-{node}.log")),
        "loader": lines(workdir.glob("kubelet*/*/logs/loader.log")),
        "triton": lines(logs.glob("tritonserver*.log")),
    }
