"""A wake (or load) on a GPU does not wait behind another model's unload when it fits without the
unloading model's memory: it goes to Triton beside the unload, the two measured as one window;
one that needs that memory still waits for the unload's end. Triton and the GPU are fakes here,
so that each side's end is the test's to choose."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agent.gpus.gpuqueue import Work
from agent.gpus.inventory import GpuInfo, GpuSnapshot
from agent.models.loadplan import LoadRequest
from agent.models.nodemodels import Models
from tests.agent.gpus.test_gpu_turns import until
from tests.agent.pods.test_ownership import owner_models, proven

GI = 1024**3
GPU = "GPU-a"


class Gpu:
    """One GPU whose used memory follows the fake Triton's loads and unloads."""

    def __init__(self, total: int) -> None:
        self.total, self.used = total, 0
        self.gate: asyncio.Event | None = None
        """While set and not open, readings wait for it."""

    @property
    def snapshot(self) -> GpuSnapshot | None:
        return None

    async def read_gpu(self, uuid: str) -> GpuInfo | None:
        if self.gate is not None:
            await self.gate.wait()
        return GpuInfo(0, uuid, "Tesla T4", self.total, self.used, True)


class Triton:
    """Loads and unloads that end when the test says, each moving the GPU's memory."""

    def __init__(self, gpu: Gpu, sizes: dict[str, int]) -> None:
        self.gpu, self.sizes = gpu, sizes
        self.started: list[str] = []
        self.finish = {name: asyncio.Event() for name in sizes}

    async def load(self, name: str, config_json: str | None = None) -> None:
        self.started.append(f"load {name}")
        await self.finish[name].wait()
        self.gpu.used += self.sizes[name]

    async def unload(self, name: str) -> None:
        self.started.append(f"unload {name}")

    async def wait_unloaded(self, name: str, time_limit: float, poll: float = 0.1) -> None:
        await self.finish[name].wait()
        self.gpu.used -= self.sizes[name]

    async def gpu_memory(self, name: str, gpu_index: int) -> int | None:
        return None  # as the Python backend: measured by NVML


async def gpu_models(tmp_path: Path, total: int, sizes: dict[str, int]) -> tuple[Models, Triton]:
    """Models with `a` loaded (measured at its size) on a GPU of `total` bytes."""
    gpu = Gpu(total)
    models = await owner_models(tmp_path, alive=True, gpus=gpu)
    triton = Triton(gpu, sizes)
    for method in ("load", "unload", "wait_unloaded", "gpu_memory"):
        setattr(models.triton, method, getattr(triton, method))
    gpu.used = sizes["a"]
    models.ledger.record_load("a", GPU, sizes["a"], 0, sizes["a"], None)
    return models, triton


def wake(models: Models, name: str, request: int) -> asyncio.Task[None]:
    owner = proven("team-b", name, f"uid-{name}", name)
    owner = type(owner)(owner.pod, request)
    return asyncio.create_task(
        models.admission.load_measured(LoadRequest(name, "{}", owner, GPU, 0, waking=True)),
        name=f"wake {name}",
    )


@pytest.mark.parametrize("unload_ends_first", [True, False])
async def test_a_wake_that_fits_goes_to_triton_beside_an_unload_and_is_billed_its_own(
    tmp_path: Path, unload_ends_first: bool
) -> None:
    models, triton = await gpu_models(tmp_path, 16 * GI, {"a": 4 * GI, "b": 2 * GI})
    try:
        sleep = asyncio.create_task(models.admission.unload_measured("a", Work.UNLOAD))
        await until(lambda: triton.started == ["unload a"], "a's unload under way")
        waking = wake(models, "b", 2 * GI)
        # Not held behind a's unload, which is still under way.
        await until(lambda: triton.started == ["unload a", "load b"], "b's load beside it")
        first, second = ("a", "b") if unload_ends_first else ("b", "a")
        triton.finish[first].set()
        await asyncio.sleep(0)
        triton.finish[second].set()
        await asyncio.gather(sleep, waking)
        # Measured as one window: a freed its 4 GiB, b took its own 2 GiB, nothing unexplained.
        assert "a" not in models.ledger.models
        assert models.ledger.measured("b") == 2 * GI
        assert models.ledger.unattributed(GPU) == 0 and models.ledger.uncertainty("b") == 0
        assert models.ledger.loading == set() and models.admission._windows == {}
        assert models.admission.queue.holder(GPU) is None
    finally:
        await models.close()


async def test_a_wake_that_needs_the_unloading_model_s_memory_waits_for_its_end(
    tmp_path: Path,
) -> None:
    models, triton = await gpu_models(tmp_path, 8 * GI, {"a": 6 * GI, "b": 4 * GI})
    try:
        sleep = asyncio.create_task(models.admission.unload_measured("a", Work.UNLOAD))
        await until(lambda: triton.started == ["unload a"], "a's unload under way")
        waking = wake(models, "b", 4 * GI)
        # Only 2 GiB are free until a's unload ends: b waits in line for it.
        await until(lambda: len(models.admission.queue.waiting(GPU)) == 1, "b waiting its turn")
        assert triton.started == ["unload a"] and models.admission.queue.beside(GPU) is None
        triton.finish["a"].set()
        await until(lambda: triton.started == ["unload a", "load b"], "b's load after a's end")
        triton.finish["b"].set()
        await asyncio.gather(sleep, waking)
        assert models.ledger.measured("b") == 4 * GI and "a" not in models.ledger.models
    finally:
        await models.close()


async def test_a_wake_granted_as_an_unload_is_billed_waits_and_is_billed_alone(
    tmp_path: Path,
) -> None:
    models, triton = await gpu_models(tmp_path, 16 * GI, {"a": 4 * GI, "b": 2 * GI})
    try:
        sleep = asyncio.create_task(models.admission.unload_measured("a", Work.UNLOAD))
        await until(lambda: triton.started == ["unload a"], "a's unload under way")
        gpu = triton.gpu
        gpu.gate = asyncio.Event()
        triton.finish["a"].set()
        await until(lambda: models.admission._windows[GPU].closing, "a's window being billed")
        # Granted beside a's turn while its window is read for the bill: it shares nothing.
        waking = wake(models, "b", 2 * GI)
        await until(lambda: len(models.admission.queue.waiting(GPU)) == 1, "b waiting its turn")
        assert triton.started == ["unload a"]
        gpu.gate.set()
        await until(lambda: triton.started == ["unload a", "load b"], "b's load after a's bill")
        triton.finish["b"].set()
        await asyncio.gather(sleep, waking)
        assert models.ledger.measured("b") == 2 * GI and models.ledger.uncertainty("b") == 0
        assert models.ledger.loading == set() and models.admission._windows == {}
    finally:
        await models.close()
