"""What a model's load asks of Triton and its GPU, decided from its files and the node's policy.

`plan_load` is the pure part of a load (`agent.models.loads`): given the model's installed
manifest, its config's text, the directories beside it and the GPU its pod was placed on, it checks
the node's policy (`agent.installs.modelconfig.ModelPolicy`) and says how the model is loaded: its
config pinned to the GPU (or the CPU), ONNX Runtime's arena released, its batchers' queue delays
bounded, and whether its GPU memory is measured apart (its backend runs it in processes of its
own). What it must not do: read files, call Triton, or step a model's life; `Loads` does, and
carries the plan out.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.installs.limits import ModelLimits
from agent.installs.modelconfig import (
    arena_released,
    backend_of,
    check_declared_backend,
    override_json,
    parse_config,
    pinned_config,
    queue_bounded,
)
from agent.pods.provenpods import Proven
from common.backends import runs_in_own_process
from common.manifest import Manifest

__all__ = ["LoadPlan", "LoadRequest", "pin_of", "plan_load"]


@dataclass(frozen=True)
class LoadRequest:
    """One load as its GPU admits it (`agent.models.gpuadmission.GpuAdmission.load_measured`)."""

    name: str
    """The model's name in Triton (its directory's)."""
    override: str
    """The config Triton loads it with (JSON)."""
    owner: Proven
    uuid: str
    """Its GPU's UUID; "" on the CPU."""
    index: int
    """Its GPU's index; -1 on the CPU."""
    size: int = 0
    """Bytes of its files: its load's time budget grows with them."""
    waking: bool = False
    """It wakes a model put to sleep (its GPU's turn is a wake's)."""
    apart: bool = False
    """Its backend runs it in processes of its own: billed what they hold, beside the GPU's other
    such loads, not in a window of the GPU's own."""


@dataclass(frozen=True)
class LoadPlan:
    """How a model is loaded, as `plan_load` decided."""

    request: LoadRequest
    pin: int | None
    """The GPU its instances are pinned to; None on the CPU."""
    lowered: tuple[str, ...]
    """What the override lowered of its batchers' queue delays ("field: asked -> loaded with")."""

    @property
    def where(self) -> str:
        """Where it loads, for messages."""
        request = self.request
        return f"GPU {request.index} ({request.uuid})" if self.pin is not None else "the CPU"


def pin_of(limits: ModelLimits, gpu_index: int) -> int | None:
    """The GPU a model's instances are pinned to; None on the CPU (a CPU-only node, or a pod
    placed on no GPU)."""
    return None if limits.cpu_only or gpu_index < 0 else gpu_index


def plan_load(
    name: str,
    owner: Proven,
    manifest: Manifest,
    config_text: str,
    directories: list[str],
    limits: ModelLimits,
    gpu: tuple[str, int],
    *,
    measures_apart: bool,
) -> LoadPlan:
    """The plan of the load of `owner`'s model, installed as `name` with `manifest`, whose
    config.pbtxt reads `config_text` and whose directory holds `directories` (what Triton will
    find, not what was installed: the model's own code may have made some since), on `gpu`
    (UUID, index). `measures_apart`: the node can measure a model's own processes. Raises the
    policy's errors (an AgentError that says why) for a load the node refuses."""
    model_id = owner.model_id
    config = parse_config(config_text, model_id)
    policy = limits.policy
    versions = policy.versions(model_id, directories)
    policy.check_config(config, model_id, owner.namespace, versions)
    check_declared_backend(config, model_id, owner.pod.backend)
    policy.check_load_data_files(config, model_id, {e.path: e.size for e in manifest.files})
    uuid, index = gpu
    pin = pin_of(limits, index)
    # Billed its own processes' memory: its load needs no window of the GPU's.
    apart = measures_apart and runs_in_own_process(backend_of(config), config.runtime)
    # Triton requires the config's name to be the directory's: the name in Triton.
    # ONNX Runtime keeps no arena in Triton's process: what a request takes, it gives back.
    # Its batchers keep a request no longer than the node's bound: an unload waits for them.
    bounded, lowered = queue_bounded(
        arena_released(pinned_config(config, name, pin)), policy.max_queue_microseconds
    )
    request = LoadRequest(
        name, override_json(bounded), owner, uuid, index, manifest.total_bytes, apart=apart
    )
    return LoadPlan(request, pin, tuple(lowered))
