"""The GPU memory a TritonModel's next replica is booked at: declared, estimated or learned.

A model that declares `spec.gpuMemory` is booked at it (`Declared`). One that declares none (an
InferenceService's, or a TritonModel written without it) is booked at the binder's first estimate
(`--gpu-memory-estimate`, `Estimated`) until a replica of its current files has loaded and the
node's agent has measured it; from then on at what it measured plus a margin (`Measured`):
max(measured x (1 + `--gpu-memory-margin`/100), measured + `--gpu-memory-margin-min`), rounded up
to a MiB. The figure is the agent's, read from its Node (`NodeInfo.measured`: no tenant writes
it), the largest of the model's replicas of its current files measured now, else the figure its
status kept for those files; new files (another `storageUri`) start from the estimate again.

`status.gpuMemory` says it: `{source, booked, estimate, measured, storageUri}` (`size_status`),
written by the model's status writer (`binder.tritonmodels.reporting`); the model's next replicas
are booked by what it says (`booked_of`, read when the model enters the cache). A measured
booking carries no per-process allowance (`common.backends`): a model's process and its CUDA
context are in what the agent measured. Replicas placed earlier keep the booking their proof of
placement names.

Pure: numbers and the model's spec and status in, numbers and the status field out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from common.quantity import QuantityError, format_quantity, parse_quantity

DECLARED = "Declared"
"""`status.gpuMemory.source`: spec.gpuMemory books the replicas."""
ESTIMATED = "Estimated"
"""`status.gpuMemory.source`: no size declared, none measured yet: the binder's first estimate."""
MEASURED = "Measured"
"""`status.gpuMemory.source`: no size declared: booked by what its current files measured."""
MIB = 1 << 20
ESTIMATE = 1 << 30
"""The default first estimate (1Gi), as `--gpu-memory-estimate`'s."""


@dataclass(frozen=True, slots=True)
class Sizing:
    """How the binder books a model that declares no GPU memory (`binder.settings`)."""

    estimate: int = ESTIMATE
    """Bytes a replica is booked at before its files have been measured."""
    margin_percent: float = 10.0
    """Percent of the measured figure booked above it."""
    margin_min: int = 128 * MIB
    """The least bytes booked above the measured figure."""
    least: int = 0
    """The least a replica may be booked at (`--min-gpu-mem`)."""

    def booking(self, measured: int) -> int:
        """What a replica measured at `measured` bytes is booked at: the larger of the two
        margins above it, rounded up to a MiB, and at least `least`."""
        above = max(math.ceil(measured * self.margin_percent / 100), self.margin_min)
        return max(-(-(measured + above) // MIB) * MIB, self.least)


DEFAULT_SIZING = Sizing()
"""The binder's defaults."""


@dataclass(frozen=True, slots=True)
class Booked:
    """How a model's next replica is booked (`booked_of`)."""

    source: str
    """DECLARED, ESTIMATED or MEASURED."""
    gpu_memory: str
    """The quantity booked (before the per-process allowance, which a measured booking has
    none of), as the replica's GPU memory request."""


def booked_of(spec: Mapping[str, Any], status: Mapping[str, Any], estimate: int) -> Booked:
    """How the model of this `spec` and `status` books its next replica: spec.gpuMemory when
    declared; else status.gpuMemory.booked when it was measured for spec.storageUri; else
    `estimate`. Never raises: a status the binder cannot read counts as none."""
    declared = spec.get("gpuMemory")
    if declared is not None:
        return Booked(DECLARED, str(declared))
    learned = learned_of(status, str(spec.get("storageUri") or ""))
    if learned is not None:
        booked = _bytes(learned.get("booked"))
        if booked:
            return Booked(MEASURED, str(booked))
    return Booked(ESTIMATED, str(estimate))


def learned_of(status: Mapping[str, Any], files: str) -> Mapping[str, Any] | None:
    """status.gpuMemory when it holds a measurement of `files`, else None."""
    sized = status.get("gpuMemory")
    if not isinstance(sized, Mapping) or not files or sized.get("storageUri") != files:
        return None
    return sized if _bytes(sized.get("measured")) else None


def size_status(
    declared: str | None,
    files: str,
    status: Mapping[str, Any],
    measured_now: int | None,
    sizing: Sizing,
) -> dict[str, Any]:
    """The model's status.gpuMemory: how its next replica is booked (`source`, `booked`), the
    first estimate when it declares no size (`declared` None: `estimate`), and what its current
    files (`files`, its spec.storageUri) measured (`measured`, `storageUri`): `measured_now`,
    the largest figure of its replicas of those files loaded now, else the one kept in `status`
    for them (absent before any)."""
    measured = measured_now
    if measured is None:
        kept = learned_of(status, files)
        measured = _bytes(kept.get("measured")) if kept is not None else None
    found: dict[str, Any] = {}
    if declared is not None:
        found["source"], found["booked"] = DECLARED, str(declared)
    elif measured:
        found["source"] = MEASURED
        found["booked"] = format_quantity(sizing.booking(measured))
    else:
        found["source"], found["booked"] = ESTIMATED, format_quantity(sizing.estimate)
    if declared is None:
        found["estimate"] = format_quantity(sizing.estimate)
    if measured:
        found["measured"] = format_quantity(measured)
        found["storageUri"] = files
    return found


def _bytes(value: object) -> int | None:
    """A quantity the binder wrote, in bytes; None when absent or unreadable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return parse_quantity(value) or None
    except QuantityError:
        return None
