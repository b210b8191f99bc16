"""The GPU memory ledger's rules, fed numbers: whose a change is, how sure, and what may evict.

The same rules run through the real agent, Triton and the mock NVML in test_gpu_memory.py; these
pin the arithmetic each rule rests on."""

from __future__ import annotations

from agent.gpus.inventory import GpuInfo, GpuSnapshot
from agent.gpus.memory import DRIVER_SHARE_CAP, MemoryLedger

GI = 1024**3
GPU = "GPU-0"


def reading(used: int) -> GpuInfo:
    return GpuInfo(0, GPU, "Tesla T4", 16 * GI, used, True)


def test_a_load_alone_on_its_gpu_is_billed_its_whole_growth_and_is_sure() -> None:
    ledger = MemoryLedger()
    ledger.observe(GpuSnapshot((reading(GI // 2),)))  # CUDA contexts: nobody's
    entry, rest = ledger.record_load("a", GPU, GI, GI // 2, GI // 2 + 3 * GI, None)
    assert (entry.bytes, rest, ledger.uncertainty("a")) == (3 * GI, None, 0)
    [over] = ledger.over()
    assert over.sure(ledger.allowed(GI)) and over.doubt() == ""


def test_growth_during_a_load_beside_others_is_billed_up_to_the_request_the_rest_to_nobody() -> (
    None
):
    ledger = MemoryLedger()
    ledger.record_load("attacker", GPU, GI, 0, GI // 2, None)
    # The victim really loads 1Gi; the attacker grows 4Gi in the same window.
    entry, rest = ledger.record_load("victim", GPU, 2 * GI, GI // 2, GI // 2 + 5 * GI, None)
    assert entry.bytes == 2 * GI
    assert rest is not None and (rest.grown, rest.during_load_of, rest.models) == (
        3 * GI,
        "victim",
        ("attacker",),
    )
    assert ledger.over() == []
    assert ledger.unattributed(GPU) == 3 * GI
    assert ledger.uncertainty("victim") == ledger.uncertainty("attacker") == 3 * GI


def test_a_sole_model_is_billed_what_grew_since_the_last_reading() -> None:
    ledger = MemoryLedger()
    ledger.record_load("a", GPU, GI, 0, GI // 2, None)
    assert ledger.observe_gpu(reading(GI // 2 + 4 * GI)) is None
    assert ledger.measured("a") == GI // 2 + 4 * GI
    [over] = ledger.over()
    assert over.sure(ledger.allowed(GI))


def test_growth_on_a_shared_gpu_is_reported_for_the_gpu_and_billed_to_no_model() -> None:
    ledger = MemoryLedger()
    ledger.record_load("a", GPU, GI, 0, GI, None)
    ledger.record_load("b", GPU, GI, GI, 2 * GI, None)
    growth = ledger.observe_gpu(reading(5 * GI))
    assert growth is not None and (growth.grown, growth.models) == (3 * GI, ("a", "b"))
    assert (ledger.measured("a"), ledger.measured("b")) == (GI, GI)
    # A wobble within the tolerance's minimum is not reported again.
    assert ledger.observe_gpu(reading(5 * GI + 100 * 1024**2)) is None


def test_what_an_unload_does_not_free_stays_uncertain_for_the_model_left_alone() -> None:
    ledger = MemoryLedger()
    ledger.record_load("a", GPU, GI, 0, GI, None)
    ledger.record_load("b", GPU, 2 * GI, GI, 3 * GI, None)
    # b's 2Gi unload frees only 1Gi: Triton kept some, or a grew meanwhile.
    ledger.record_unload("b", 3 * GI, 2 * GI)
    ledger.observe_gpu(reading(2 * GI))
    assert ledger.measured("a") == 2 * GI
    assert ledger.uncertainty("a") == GI
    [over] = ledger.over()
    assert not over.sure(ledger.allowed(GI))
    assert "while other models shared it" in over.doubt()


def test_an_empty_gpu_starts_over_with_nothing_uncertain() -> None:
    ledger = MemoryLedger()
    ledger.record_load("a", GPU, GI, 0, GI, None)
    ledger.record_load("b", GPU, GI, GI, 4 * GI, None)
    ledger.record_unload("a", 4 * GI, 3 * GI)
    ledger.record_unload("b", 3 * GI, GI // 4)  # what is left is Triton's, nobody's model
    entry, _ = ledger.record_load("c", GPU, GI, GI // 4, GI // 4 + 3 * GI, None)
    assert entry.bytes == 3 * GI and ledger.uncertainty("c") == 0


def test_triton_s_own_figure_is_sure_and_never_lowered_by_nvml() -> None:
    ledger = MemoryLedger()
    entry, _ = ledger.record_load("t", GPU, GI, 0, 3 * GI, 2 * GI)
    assert (entry.bytes, entry.source, ledger.uncertainty("t")) == (2 * GI, "triton", 0)
    ledger.observe_gpu(reading(GI))
    assert ledger.measured("t") == 2 * GI


def test_models_found_loaded_after_a_restart_make_their_gpu_shared_and_unsure() -> None:
    """The agent restarts with a model loaded: its load was never read, so a neighbour loading
    beside it is measured as shared, and nothing on the GPU can be evicted on NVML's word."""
    ledger = MemoryLedger()
    ledger.observe_gpu(reading(3 * GI))  # before adoption: the old model looks like baseline
    ledger.adopt("old", GPU, GI)
    entry, rest = ledger.record_load("new", GPU, GI, 3 * GI, 6 * GI, None)
    assert entry.bytes == GI and rest is not None and rest.grown == 2 * GI
    ledger.record_unload("new", 6 * GI, 5 * GI)
    ledger.observe_gpu(reading(8 * GI))
    [over] = ledger.over()
    assert over.model.model_id == "old" and not over.sure(ledger.allowed(GI))


def test_a_reload_in_place_keeps_what_the_model_held() -> None:
    """Triton reloads a loaded model in place: the GPU barely changes, and the model's memory
    is still its own, not the GPU's baseline."""
    ledger = MemoryLedger()
    ledger.record_load("a", GPU, GI, 0, 2 * GI, None)
    entry, _ = ledger.record_load("a", GPU, GI, 2 * GI, 2 * GI + GI // 2, None)
    assert entry.bytes == 2 * GI + GI // 2
    ledger.observe_gpu(reading(3 * GI))
    assert ledger.measured("a") == 3 * GI


def test_a_load_beside_an_unload_that_keeps_bytes_is_never_sure_of_them() -> None:
    ledger = MemoryLedger()
    ledger.observe(GpuSnapshot((reading(0),)))
    ledger.record_load("sleeper", GPU, 4 * GI, 0, 4 * GI, None)
    # One window: the sleeper's unload frees all but 1Gi; the waker loads its 2Gi.
    ledger.record_unload("sleeper", 4 * GI, 0)  # billed as freeing its figure
    entry, rest = ledger.record_load("waker", GPU, 2 * GI, 0, 3 * GI, None, beside=("sleeper",))
    assert entry.bytes == 2 * GI and ledger.uncertainty("waker") == GI
    assert rest is not None and (rest.grown, rest.models) == (GI, ("sleeper",))
    # Alone on the GPU, the waker's figure takes the kept GiB, but it can never evict it.
    ledger.observe(GpuSnapshot((reading(3 * GI),)))
    [over] = ledger.over()
    assert over.model.model_id == "waker" and not over.sure(ledger.allowed(2 * GI))


def test_a_model_measured_apart_is_its_processes_and_never_anothers_growth() -> None:
    """A Python model billed its own process's memory beside an in-process model alone in the
    GPU's remaining memory: the Python model growing is its own, never the other's, and an
    over-user measured apart is sure."""
    ledger = MemoryLedger()
    ledger.observe(GpuSnapshot((reading(GI // 2),)))
    ledger.record_load("onnx", GPU, 2 * GI, GI // 2, GI // 2 + GI, None)
    ledger.record_apart("python", GPU, GI, GI + GI // 2)  # its stub: 1.5Gi
    # The stub grows to 4Gi; the poll's per-process reading comes with the GPU's.
    ledger.refresh_apart(GPU, {"python": 4 * GI})
    ledger.observe(GpuSnapshot((reading(GI // 2 + GI + 4 * GI),)))
    assert (ledger.measured("onnx"), ledger.measured("python")) == (GI, 4 * GI)
    assert ledger.unattributed(GPU) == 0 and ledger.uncertainty("python") == 0
    [over] = ledger.over()
    assert over.model.model_id == "python" and over.sure(ledger.allowed(GI))
    # Its unload frees what its processes held: nothing of it stays unexplained.
    ledger.record_unload("python", GI // 2 + GI, GI // 2 + GI)
    ledger.refresh_apart(GPU, {})
    ledger.observe(GpuSnapshot((reading(GI // 2 + GI),)))
    assert (ledger.measured("onnx"), ledger.unattributed(GPU)) == (GI, 0)


def test_growth_outside_every_process_measured_apart_is_blamed_on_no_model_beside_them() -> None:
    """A tenant's Python model hides memory in a process outside Triton's tree (or has Triton
    allocate for it): its own figure misses it, and its in-process neighbour, the only model
    measured by the GPU's used memory, must not be billed (or evicted) for it: beside a model
    measured apart, growth is unexplained, as beside any other model."""
    ledger = MemoryLedger(tolerance_min=0)
    ledger.observe(GpuSnapshot((reading(GI // 2),)))
    ledger.record_load("onnx", GPU, GI, GI // 2, GI // 2 + GI, None)
    ledger.record_apart("python", GPU, GI, GI)
    ledger.refresh_apart(GPU, {"python": GI})
    [growth] = ledger.observe(GpuSnapshot((reading(GI // 2 + GI + GI + 3 * GI),)))
    assert (growth.grown, growth.models) == (3 * GI, ("onnx", "python"))
    assert ledger.measured("onnx") == GI and ledger.over() == []
    # A load beside a model measured apart is billed up to its request, the rest unexplained.
    entry, rest = ledger.record_load("onnx2", GPU, GI, 6 * GI, 10 * GI, None)
    assert entry.bytes == GI and rest is not None and rest.grown == 3 * GI


def test_the_drivers_share_of_processes_measured_apart_is_theirs_up_to_a_cap() -> None:
    """NVML's per-process figures leave out the driver's part of each CUDA context: what the GPU
    grew by across loads measured apart beyond their processes is billed to them by their
    processes, kept through later readings and gone with them; past the cap a process, the
    growth is nobody's, and a share is never sure (a neighbour may have caused it)."""
    mi = 1024**2
    ledger = MemoryLedger(tolerance_min=0)
    ledger.observe(GpuSnapshot((reading(GI // 2),)))
    ledger.record_apart("one", GPU, GI, GI)
    ledger.record_apart("two", GPU, GI, GI)  # two instances: two processes
    ledger.refresh_apart(GPU, {"one": GI, "two": GI})
    assert ledger.share_apart(GPU, 18 * mi, {"one": 1, "two": 2}) == 0
    assert (ledger.measured("one"), ledger.measured("two")) == (GI + 6 * mi, GI + 12 * mi)
    ledger.observe(GpuSnapshot((reading(GI // 2 + 2 * GI + 18 * mi),)))
    assert ledger.unattributed(GPU) == 0
    assert ledger.uncertainty("two") == 12 * mi
    # A later reading of what the processes hold keeps the share; a process gone takes it along.
    ledger.refresh_apart(GPU, {"one": GI + mi, "two": GI})
    assert (ledger.measured("one"), ledger.measured("two")) == (GI + 7 * mi, GI + 12 * mi)
    ledger.refresh_apart(GPU, {"two": GI})
    assert ledger.measured("one") == 0
    # Growth past the cap a process is unexplained, never a model's.
    ledger.record_apart("three", GPU, GI, GI)
    rest = ledger.share_apart(GPU, 100 * mi, {"three": 1})
    assert (ledger.measured("three"), rest) == (GI + DRIVER_SHARE_CAP, 100 * mi - DRIVER_SHARE_CAP)
    # Nothing to share, or no process to share it with: nothing billed.
    assert ledger.share_apart(GPU, -mi, {"three": 1}) == 0
    assert ledger.share_apart(GPU, mi, {"gone": 1}) == mi
    assert ledger.measured("three") == GI + DRIVER_SHARE_CAP
