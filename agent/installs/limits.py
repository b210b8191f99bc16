"""What the agent's settings say about model operations: one frozen value, built once by
`agent.app` from the settings and read by `agent.models.nodemodels` and `agent.models.install`."""

from __future__ import annotations

from dataclasses import dataclass

from agent.installs.modelconfig import ModelPolicy


@dataclass(frozen=True)
class ModelLimits:
    """What the agent's settings say about model operations."""

    policy: ModelPolicy
    """Which backends and configurations a namespace's models may use."""
    cpu_only: bool
    """No GPUs on the node: models load on the CPU and no GPU is checked or measured."""
    unload_timeout: float = 120.0
    """Seconds an unload may take in Triton."""
    max_model_bytes: int = 64 * 1024**3
    """The largest model an install may declare, in bytes."""
    install_deadline: float = 1800.0
    """Seconds a whole install may take."""
    install_idle: float = 120.0
    """Seconds an install may go without a chunk."""
    install_first_chunk: float = 10.0
    """Seconds an install may wait for its first chunk."""
    gpu_mem_reserve: int = 0
    """Bytes of each GPU no model may be admitted to use."""
    load_timeout_base: float = 30.0
    """Seconds any load may hold its GPU's slot, plus `load_timeout_per_gib` per GiB of files."""
    load_timeout_per_gib: float = 60.0
    """Seconds a load may hold its GPU's slot per GiB of the model's files."""
    load_timeout: float = 600.0
    """The most seconds any load may take, whatever its size."""
    parallel_loads: int = 1
    """Loads measured apart (by their own processes) that may share one GPU at once."""
    max_load_attempts: int = 5
    """Loads refused in a row after which none is tried until the model changes (0: no bound)."""
