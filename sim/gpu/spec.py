"""The simulated GPUs a mock NVML serves: presets, JSON/YAML spec files, and timelines of changes.

Pure: parses text and files into values; `sim.gpu.nvml` serves them through pynvml's API. The spec
format is documented in sim/gpu/nvml.py and docs/agent.md.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from common.quantity import parse_quantity


@dataclass(frozen=True)
class Product:
    """A GPU model as NVML names it, with its memory in bytes."""

    name: str
    memory: int


MiB = 1024 * 1024
PRODUCTS: dict[str, Product] = {
    "A100-80GB": Product("NVIDIA A100-SXM4-80GB", 81920 * MiB),
    "A100-40GB": Product("NVIDIA A100-SXM4-40GB", 40960 * MiB),
    "T4": Product("Tesla T4", 15360 * MiB),
    "H100-80GB": Product("NVIDIA H100 80GB HBM3", 81559 * MiB),
    "H200": Product("NVIDIA H200", 143771 * MiB),
    "L4": Product("NVIDIA L4", 23034 * MiB),
}


@dataclass
class GpuState:
    """One simulated GPU: what NVML reports about it, and whether it still answers."""

    uuid: str
    product: str
    memory: int
    used: int = 0
    lost: bool = False


@dataclass(frozen=True)
class Event:
    """A change at `at` seconds after start: used memory, or a fault (lost, recovered,
    nvml_not_loaded, nvml_loaded)."""

    at: float
    gpu: int | None = None
    used: int | None = None
    fault: str | None = None


FAULTS = ("lost", "recovered", "nvml_not_loaded", "nvml_loaded")


class SpecError(ValueError):
    """A mock NVML spec that cannot be read; the message says what to write instead."""


@dataclass
class Spec:
    """The simulated GPUs and the timeline of changes."""

    gpus: list[GpuState]
    events: list[Event] = field(default_factory=list)


def _uuid_for(seed: str, index: int) -> str:
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"tritonshare-mock-nvml/{seed}/{index}"))


def _parse_events(raw: object, where: str) -> list[Event]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise SpecError(f"{where}: 'events' must be a list of {{at, gpu, used|fault}} objects")
    events = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or "at" not in item:
            raise SpecError(f"{where}: event {i} must be an object with 'at' (seconds)")
        fault = item.get("fault")
        if fault is not None and fault not in FAULTS:
            raise SpecError(f"{where}: event {i} has fault {fault!r}; use one of {FAULTS}")
        used = item.get("used")
        events.append(
            Event(
                at=float(item["at"]),
                gpu=None if item.get("gpu") is None else int(item["gpu"]),
                used=None if used is None else parse_quantity(used, what=f"event {i} used"),
                fault=fault,
            )
        )
    return sorted(events, key=lambda e: e.at)


def load_events(path: Path) -> list[Event]:
    """The `events` list of a faults file (JSON or YAML)."""
    data = _read_document(path)
    return _parse_events(data.get("events"), str(path))


def _read_document(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as e:
        raise SpecError(f"cannot read mock NVML file {path}: {e}") from e
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as e:
        raise SpecError(f"{path} is not valid JSON/YAML: {e}") from e
    if not isinstance(data, dict):
        raise SpecError(f"{path} must hold an object with 'gpus' (and optional 'events')")
    return data


def parse_spec(text: str, *, seed: str = "node") -> Spec:
    """A preset (`2xT4`) or the path of a JSON/YAML spec file; `seed` makes UUIDs per node."""
    count, sep, product_key = text.partition("x")
    if sep and count.isdigit() and product_key in PRODUCTS:
        product = PRODUCTS[product_key]
        return Spec(
            gpus=[
                GpuState(uuid=_uuid_for(seed, i), product=product.name, memory=product.memory)
                for i in range(int(count))
            ]
        )
    path = Path(text)
    if not path.exists():
        raise SpecError(
            f"mock NVML spec {text!r} is neither a preset ({', '.join(sorted(PRODUCTS))} as "
            f"'2xT4') nor an existing JSON/YAML file"
        )
    data = _read_document(path)
    raw_gpus = data.get("gpus")
    if not isinstance(raw_gpus, list):
        raise SpecError(f"{path}: 'gpus' must be a list of {{product, memory, used, uuid}}")
    gpus = []
    for i, item in enumerate(raw_gpus):
        if not isinstance(item, dict) or "memory" not in item:
            raise SpecError(f"{path}: gpu {i} needs at least 'memory' (such as '16Gi')")
        gpus.append(
            GpuState(
                uuid=str(item.get("uuid") or _uuid_for(seed, i)),
                product=str(item.get("product", "NVIDIA Mock GPU")),
                memory=parse_quantity(item["memory"], what=f"gpu {i} memory"),
                used=parse_quantity(item.get("used", 0), what=f"gpu {i} used"),
            )
        )
    return Spec(gpus=gpus, events=_parse_events(data.get("events"), str(path)))
