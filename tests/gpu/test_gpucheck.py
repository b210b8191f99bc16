"""`python -m agent.gpucheck` on the mock NVML: what it prints is what the agent publishes, its
measurement is the agent's, and every failure has its exit code and a message saying what to do.

The real-GPU half is tests/gpu/test_real_gpu.py.
"""

from __future__ import annotations

import asyncio
import importlib.util
import io
import json
import subprocess
import sys
import types
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from agent.gpucheck import DECLARATION, Outcome, main, parse_settings, smallest_request_within
from agent.gpus.inventory import GpuInfo
from agent.gpus.memory import TOLERANCE_MIN_BYTES, MemoryLedger, tolerance
from agent.gpus.nvml import GpuReader
from agent.gpus.standin import StandInError, TorchStandIn
from agent.metrics import AgentMetrics
from agent.settings import DECLARATION as AGENT_DECLARATION
from agent.settings import parse_settings as agent_settings
from agent.status.node import NodePublisher, NodeSettings
from common.contract import Keys
from sim.gpu.nvml import NVML_ERROR_NOT_SUPPORTED, MockNvml, NVMLError, parse_spec
from tests.executors import CallerThread
from tests.gpu import hardware

MIB = 1024**2
GIB = 1024**3
T4 = 15360 * MIB
CONTEXT = 500 * MIB
"""What the stand-in's CUDA context takes on the mock (an H100's is of this order)."""
STAND_IN_PID = 4242


class Gpus:
    """A mock NVML node plus the two calls the check adds that the mock does not offer (MIG
    mode, compute processes), answering as the real library does: NOT_SUPPORTED for MIG on a
    GPU without it, and the GPU's own error when it is lost."""

    def __init__(self, spec: str = "2xT4") -> None:
        self.mock = MockNvml(parse_spec(spec, seed="gpucheck"))
        self.module = self.mock.as_module()
        self.mig: dict[int, tuple[int, int]] = {}
        self.processes: dict[int, dict[int, int]] = {}
        module: Any = self.module
        module.nvmlDeviceGetMigMode = self._mig_mode
        module.nvmlDeviceGetComputeRunningProcesses = self._processes

    def _mig_mode(self, handle: Any) -> list[int]:
        self.module.nvmlDeviceGetUUID(handle)  # the mock's own checks: initialised, not lost
        if handle.index not in self.mig:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return list(self.mig[handle.index])

    def _processes(self, handle: Any) -> list[types.SimpleNamespace]:
        self.module.nvmlDeviceGetUUID(handle)
        return [
            types.SimpleNamespace(pid=pid, usedGpuMemory=used)
            for pid, used in self.processes.get(handle.index, {}).items()
        ]

    def used(self, index: int) -> int:
        return self.mock.gpus[index].used

    def add(self, index: int, amount: int) -> None:
        self.mock.set_used(index, self.used(index) + amount)
        held = self.processes.setdefault(index, {})
        held[STAND_IN_PID] = held.get(STAND_IN_PID, 0) + amount
        if not held[STAND_IN_PID]:
            del held[STAND_IN_PID]


class MockStandIn:
    """The torch stand-in's effect on the mock: its CUDA context, then its allocation, become
    its GPU's used memory. `stray` bytes are allocated by someone else during the load."""

    pid = STAND_IN_PID

    def __init__(self, gpus: Gpus, gpu: GpuInfo, amount: int, *, stray: int = 0) -> None:
        self.gpus, self.index, self.amount, self.stray = gpus, gpu.index, amount, stray
        self.steps: list[str] = []
        self.allocated = False

    def start(self) -> str:
        self.steps.append("start")
        self.gpus.add(self.index, CONTEXT)
        return "mock torch"

    def allocate(self) -> None:
        self.steps.append("allocate")
        self.gpus.add(self.index, self.amount)
        self.gpus.mock.set_used(self.index, self.gpus.used(self.index) + self.stray)
        self.allocated = True

    def free(self) -> None:
        self.steps.append("free")
        self.gpus.add(self.index, -self.amount - self.stray)
        self.allocated = False

    def stop(self) -> None:
        self.steps.append("stop")
        if self.allocated:
            self.gpus.add(self.index, -self.amount - self.stray)
        self.gpus.add(self.index, -CONTEXT)


def check(
    gpus: Gpus, *argv: str, stray: int = 0, made: list[MockStandIn] | None = None
) -> tuple[int, dict[str, Any]]:
    """Run the check as JSON on the mock; returns its exit code and report."""
    made = [] if made is None else made

    def stand_in(gpu: GpuInfo, amount: int, timeout: float) -> MockStandIn:
        made.append(MockStandIn(gpus, gpu, amount, stray=stray))
        return made[-1]

    out = io.StringIO()
    code = main(
        ["--json", "--settle-seconds", "0", *argv],
        {},
        nvml=gpus.module,
        stand_in=stand_in,
        out=out,
    )
    return code, json.loads(out.getvalue())


class RecordingNode:
    """The NodeApi of agent.status.node, recording the annotations the agent writes."""

    def __init__(self) -> None:
        self.written: dict[str, str] = {}

    async def get_node(self, name: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "annotations": {}}}

    async def patch_node_annotations(
        self, name: str, annotations: Mapping[str, str | None]
    ) -> None:
        self.written.update({k: v for k, v in annotations.items() if v is not None})

    async def patch_node_capacity(self, name: str, resources: dict[str, str]) -> None:
        raise AssertionError("not advertised")

    async def renew_lease(self, *args: object) -> None:
        raise AssertionError("not renewed here")

    async def record_node_event(
        self, name: str, *, reason: str, message: str, component: str, event_type: str = "Warning"
    ) -> None:
        raise AssertionError(f"no Event expected here: {reason}: {message}")


def published_by_the_agent(gpus: Gpus, keys: Keys) -> dict[str, str]:
    node = RecordingNode()
    publisher = NodePublisher(
        node,
        GpuReader(nvml=gpus.module),
        AgentMetrics(),
        NodeSettings(
            node_name="gpu-node-1",
            keys=keys,
            system_namespace="tritonshare-system",
            cpu_only=False,
        ),
        nvml_executor=CallerThread(),
        on_snapshot=lambda snapshot: None,
        usage=MemoryLedger().annotation,
    )
    publisher.read_gpus()
    asyncio.run(publisher.publish())
    return node.written


def test_the_exit_codes_are_the_documented_ones() -> None:
    assert {o.name: int(o) for o in Outcome} == {
        "OK": 0,
        "USAGE": 2,
        "NVML_UNUSABLE": 3,
        "NO_GPU": 4,
        "GPU_UNHEALTHY": 5,
        "STAND_IN_FAILED": 6,
        "REFUSED": 7,
        "MEASUREMENT_OFF": 8,
    }


@pytest.mark.parametrize("prefix", ["tritonshare.io/", "seldon.io/trtis-"])
def test_the_printed_annotations_are_those_the_agent_writes_on_its_node(prefix: str) -> None:
    gpus = Gpus()
    gpus.mock.set_used(1, 3 * GIB)
    code, report = check(gpus, "--key-prefix", prefix)
    assert code == Outcome.OK
    keys = Keys(prefix)
    assert report["annotations"] == published_by_the_agent(gpus, keys)
    assert report["annotations"][keys.gpu_mem_total] == str(2 * T4)
    listed = json.loads(report["annotations"][keys.gpus])
    assert [g["uuid"] for g in listed] == [g.uuid for g in gpus.mock.gpus]
    assert report["capacity"] == {keys.gpu_mem: str(2 * T4)}
    assert [g["memory_used"] for g in report["gpus"]] == [0, 3 * GIB]

    out = io.StringIO()
    main(["--key-prefix", prefix], {}, nvml=gpus.module, out=out)
    for key, value in report["annotations"].items():
        assert f"  {key}: {value}\n" in out.getvalue()


def test_the_agents_own_variables_set_the_checks_shared_flags() -> None:
    environ = {
        "TRITONSHARE_KEY_PREFIX": "seldon.io/trtis-",
        "TRITONSHARE_GPU_MEM_RESERVE": "1Gi",
        "TRITONSHARE_GPU_MEM_TOLERANCE": "0.1",
        "TRITONSHARE_GPU_MEM_ENFORCEMENT": "evict",
    }
    required = ["--node-name", "n", "--model-repository", "/m", "--placement-key-dir", "/k"]
    agent = agent_settings(required, environ)
    mine = parse_settings([], environ)
    assert mine.key_prefix == agent.keys
    assert (mine.gpu_mem_reserve, mine.gpu_mem_tolerance, mine.gpu_mem_enforcement) == (
        agent.gpu_mem_reserve,
        agent.gpu_mem_tolerance,
        agent.gpu_mem_enforcement,
    )
    agents = {s.flag: s for s in AGENT_DECLARATION.settings}
    for flag in ("key-prefix", "gpu-mem-reserve", "gpu-mem-tolerance", "gpu-mem-enforcement"):
        (setting,) = (s for s in DECLARATION.settings if s.flag == flag)
        assert (setting.default, setting.variable, setting.help) == (
            agents[flag].default,
            agents[flag].variable,
            agents[flag].help,
        ), flag


def test_mig_mode_and_the_processes_holding_memory_are_read() -> None:
    gpus = Gpus()
    gpus.mig[1] = (1, 1)
    gpus.processes[1] = {77: 2 * GIB, 78: None}  # type: ignore[dict-item]
    code, report = check(gpus)
    assert code == Outcome.OK
    assert [g["mig"] for g in report["gpus"]] == ["not supported", "enabled"]
    assert report["gpus"][1]["processes"] == [
        {"pid": 77, "used": 2 * GIB},
        {"pid": 78, "used": None},
    ]
    assert any("MIG enabled" in note for note in report["notes"])

    gpus.mig[1] = (0, 1)
    _, report = check(gpus)
    assert report["gpus"][1]["mig"] == "disabled, enabled after the next GPU reset"


def test_the_reserve_covers_the_fullest_idle_gpu_and_the_backends_libraries() -> None:
    """--reserve: each GPU's idle use as NVML reads it (Triton's context and pool on the node),
    and a reserve of the largest plus the backends' allowance, rounded up to 256 MiB."""
    gpus = Gpus()
    triton = 4000
    for index, held in ((0, 600 * MIB), (1, 900 * MIB)):
        gpus.mock.set_used(index, held)
        gpus.processes[index] = {triton: held}
    code, report = check(gpus, "--reserve")
    assert code == Outcome.OK
    assert [(b["index"], b["used"], b["held_by_processes"]) for b in report["baselines"]] == [
        (0, 600 * MIB, 600 * MIB),
        (1, 900 * MIB, 900 * MIB),
    ]
    # 900 MiB + 256 MiB = 1156 MiB, rounded up to 1280 MiB.
    assert report["suggested_reserve"] == 1280 * MIB
    out = io.StringIO()
    assert main(["--reserve"], {}, nvml=gpus.module, out=out) == Outcome.OK
    text = out.getvalue()
    assert "GPU 1 (" in text and "by the processes NVML lists: 943718400 bytes" in text
    assert "Suggested --gpu-mem-reserve: 1280Mi (1342177280 bytes)" in text, text
    # Without the flag nothing of it is read or printed.
    _, plain = check(gpus)
    assert plain["baselines"] == [] and plain["suggested_reserve"] is None


def test_the_reserve_leaves_out_a_lost_gpu_and_says_when_the_driver_hides_processes() -> None:
    gpus = Gpus()
    gpus.mock.set_used(0, 700 * MIB)
    gpus.processes[0] = {4000: None}  # type: ignore[dict-item]
    gpus.mock.lose_gpu(1)
    code, report = check(gpus, "--reserve")
    assert code == Outcome.GPU_UNHEALTHY
    [baseline] = report["baselines"]
    assert baseline["index"] == 0 and baseline["held_by_processes"] is None
    assert report["suggested_reserve"] == 1024 * MIB


def test_nvml_that_cannot_load_says_to_check_the_driver() -> None:
    gpus = Gpus()
    gpus.mock.set_library_loaded(False)
    out = io.StringIO()
    code = main([], {}, nvml=gpus.module, out=out)
    assert code == Outcome.NVML_UNUSABLE
    assert "NVML Shared Library Not Found" in out.getvalue()
    assert "nvidia-smi" in out.getvalue()
    assert "The agent would write" not in out.getvalue()


def test_nvml_without_gpus_says_how_to_give_the_container_one() -> None:
    code, report = check(Gpus("0xT4"), "--measure", "1Gi")
    assert code == Outcome.NO_GPU
    assert "runtimeClassName nvidia" in report["problems"][0]
    assert report["measurement"] is None


def test_a_lost_gpu_is_published_unhealthy_and_fails_the_check() -> None:
    gpus = Gpus()
    gpus.mock.lose_gpu(1)
    code, report = check(gpus)
    assert code == Outcome.GPU_UNHEALTHY
    keys = Keys()
    assert report["annotations"][keys.gpu_mem_total] == str(T4)
    assert [g["healthy"] for g in json.loads(report["annotations"][keys.gpus])] == [True, False]
    assert "GPU 1" in report["problems"][0] and "Xid" in report["problems"][0]
    assert "GpuIsLost" in report["gpus"][1]["reason"]


def test_a_known_load_is_measured_exactly_and_freed() -> None:
    gpus = Gpus()
    gpus.mock.set_used(0, 300 * MIB)  # someone else's, before the stand-in
    made: list[MockStandIn] = []
    code, report = check(gpus, "--measure", "1Gi", made=made)
    assert code == Outcome.OK, report["problems"]
    m = report["measurement"]
    assert (m["known"], m["measured"], m["error"], m["polled"]) == (GIB, GIB, 0, GIB)
    assert m["before_used"] - m["idle_used"] == CONTEXT
    assert m["process_used"] == CONTEXT + GIB
    assert (m["admission"], m["second_admission"], m["over"]) == ("", "", False)
    assert m["action"].startswith("none")
    usage = json.loads(m["usage_annotation"])
    assert usage[gpus.mock.gpus[0].uuid]["models"] == {"gpucheck-stand-in": GIB}
    assert m["freed_used"] == m["before_used"]
    assert m["unattributed_after_unload"] == 0
    assert m["exited_used"] == m["idle_used"] == gpus.used(0) == 300 * MIB
    assert made[0].steps == ["start", "allocate", "free", "stop"]


def test_a_second_pod_of_the_same_request_is_refused_when_the_gpu_is_booked() -> None:
    code, report = check(Gpus(), "--measure", "1Gi", "--request", "8Gi")
    assert code == Outcome.OK
    m = report["measurement"]
    assert m["admission"] == ""
    assert "are booked by the other pods placed on it" in m["second_admission"]


def test_a_model_over_its_request_would_be_evicted_and_the_threshold_is_shown() -> None:
    code, report = check(
        Gpus(), "--measure", "2Gi", "--request", "1Gi", "--gpu-mem-enforcement", "evict"
    )
    assert code == Outcome.OK  # the measurement itself is right; the pod asked too little
    m = report["measurement"]
    assert m["over"] is True
    assert m["action"].startswith("evict")
    # 2Gi is within r + max(5% r, 256Mi) from r = 2Gi - 256Mi on (5% of it is under 256Mi).
    assert m["over_below"] == 2 * GIB - 256 * MIB


def test_the_threshold_follows_the_agents_rule_on_both_sides() -> None:
    for measured in (1, 300 * MIB, 2 * GIB, 80 * GIB + 12345):
        r = smallest_request_within(measured, 0.05, TOLERANCE_MIN_BYTES)
        assert measured <= r + tolerance(r, 0.05, TOLERANCE_MIN_BYTES)
        assert r == 0 or measured > r - 1 + tolerance(r - 1, 0.05, TOLERANCE_MIN_BYTES)


def test_a_load_the_agent_would_refuse_is_not_made() -> None:
    gpus = Gpus()
    made: list[MockStandIn] = []
    code, report = check(gpus, "--measure", "20Gi", made=made)
    assert code == Outcome.REFUSED
    assert "do not fit" in report["measurement"]["admission"]
    assert made[0].steps == ["start", "stop"]
    assert gpus.used(0) == 0


def test_a_figure_off_by_more_than_the_tolerance_fails_the_check() -> None:
    code, report = check(Gpus(), "--measure", "1Gi", stray=512 * MIB)
    assert code == Outcome.MEASUREMENT_OFF
    assert report["measurement"]["error"] == 512 * MIB
    assert "off by 536870912" in report["problems"][0]


def test_a_stand_in_that_fails_is_stopped_and_reported() -> None:
    gpus = Gpus()

    class Failing(MockStandIn):
        def allocate(self) -> None:
            self.steps.append("allocate")
            raise StandInError("the stand-in model process did not allocate within 1 s")

    made: list[MockStandIn] = []

    def stand_in(gpu: GpuInfo, amount: int, timeout: float) -> MockStandIn:
        made.append(Failing(gpus, gpu, amount))
        return made[-1]

    out = io.StringIO()
    code = main(["--measure", "1Gi"], {}, nvml=gpus.module, stand_in=stand_in, out=out)
    assert code == Outcome.STAND_IN_FAILED
    assert "did not allocate within 1 s" in out.getvalue()
    assert made[0].steps == ["start", "allocate", "stop"]
    assert gpus.used(0) == 0


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--measure", "lots"], "--measure: 'lots' is not a Kubernetes quantity"),
        (["--gpu-mem-enforcement", "kill"], "--gpu-mem-enforcement"),
        (["--gpu", "2", "--measure", "1Gi"], "--gpu 2: NVML lists 2 GPUs"),
        (["--meas", "1Gi"], "unrecognized arguments: --meas"),
    ],
)
def test_bad_flags_say_what_to_write(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = io.StringIO()
    code = main(argv, {}, nvml=Gpus().module, stand_in=_never, out=out)
    assert code == Outcome.USAGE
    assert says in capsys.readouterr().err + out.getvalue()


def _never(gpu: GpuInfo, amount: int, timeout: float) -> MockStandIn:
    raise AssertionError("no stand-in for a bad flag")


def torch_missing() -> bool:
    return importlib.util.find_spec("torch") is None


@pytest.mark.skipif(not torch_missing(), reason="torch is installed: its absence cannot be seen")
def test_without_torch_the_real_stand_in_says_what_to_install() -> None:
    gpus = Gpus()
    gpu = GpuReader(nvml=gpus.module).read().gpus[0]
    stand_in = TorchStandIn(gpu, MIB, 60)
    with pytest.raises(StandInError, match=r"torch cannot be imported .* install torch"):
        stand_in.start()
    stand_in.stop()

    out = io.StringIO()
    code = main(["--measure", "1Mi"], {}, nvml=gpus.module, out=out)
    assert code == Outcome.STAND_IN_FAILED
    assert "install torch with CUDA" in out.getvalue()
    assert gpus.used(0) == 0


def test_the_command_on_a_machine_without_a_driver_exits_3_with_json() -> None:
    try:
        hardware.real_gpus()
    except pytest.skip.Exception:
        pass
    else:
        pytest.skip("this machine has a GPU: tests/gpu/test_real_gpu.py runs the command")
    result = subprocess.run(
        [sys.executable, "-m", "agent.gpucheck", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == Outcome.NVML_UNUSABLE, result.stderr
    assert json.loads(result.stdout)["outcome"] == "nvml_unusable"
    assert "nvidia-smi" in result.stderr


@pytest.mark.parametrize(
    ("environ", "then"),
    [
        ({}, pytest.skip.Exception),
        ({"CI": "true"}, pytest.skip.Exception),
        ({"CI": "true", "TRITONSHARE_REQUIRE_GPU": "1"}, pytest.fail.Exception),
        ({"TRITONSHARE_REQUIRE_GPU": "yes"}, pytest.fail.Exception),
    ],
)
def test_a_missing_gpu_skips_unless_a_gpu_is_required(
    environ: dict[str, str], then: Callable[..., Any]
) -> None:
    with pytest.raises(then):  # type: ignore[call-overload]
        hardware.require(False, "no GPU here", environ)
    hardware.require(True, "never said", environ)


FAKE_TORCH = '''
"""A torch with a fake GPU, for the stand-in's protocol only: it allocates nothing."""
import os
import types

__version__ = "0.0-fake"
version = types.SimpleNamespace(cuda="0.0")
_reserved = 0


class _Tensor:
    def __init__(self, size):
        self.size = size

    def fill_(self, value):
        return self


def empty(size, dtype=None, device=None):
    global _reserved
    _reserved += size
    return _Tensor(size)


uint8 = "uint8"


class cuda:
    @staticmethod
    def is_available():
        return True

    @staticmethod
    def synchronize():
        pass

    @staticmethod
    def get_device_properties(index):
        return types.SimpleNamespace(uuid=os.environ["FAKE_UUID"], name="Fake GPU 80GB")

    @staticmethod
    def memory_reserved():
        return _reserved

    @staticmethod
    def empty_cache():
        global _reserved
        _reserved = 0
'''


@pytest.fixture
def fake_torch(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> GpuInfo:
    """The stand-in's child finds a fake torch first; returns the GPU it pins to."""
    (tmp_path / "torch.py").write_text(FAKE_TORCH)
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{sys.path[0]}")
    gpu = GpuReader(nvml=Gpus().module).read().gpus[0]
    monkeypatch.setenv("FAKE_UUID", gpu.uuid.removeprefix("GPU-"))
    return gpu


def test_the_torch_stand_in_starts_allocates_frees_and_is_reaped(fake_torch: GpuInfo) -> None:
    stand_in = TorchStandIn(fake_torch, 3 * MIB, 60)
    try:
        assert stand_in.start() == "torch 0.0-fake on Fake GPU 80GB"
        assert stand_in.pid is not None
        stand_in.allocate()
        stand_in.free()
    finally:
        stand_in.stop()
    assert stand_in._process is None


def test_a_stand_in_on_another_gpu_than_its_pin_is_refused(
    fake_torch: GpuInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_UUID", "00000000-0000-0000-0000-000000000000")
    stand_in = TorchStandIn(fake_torch, MIB, 60)
    try:
        with pytest.raises(StandInError, match=r"not on GPU 0 .* wrong GPU"):
            stand_in.start()
    finally:
        stand_in.stop()


def test_a_stand_in_that_hangs_is_given_up_after_the_timeout(
    fake_torch: GpuInfo, tmp_path: Any
) -> None:
    (tmp_path / "torch.py").write_text("import time\ntime.sleep(60)\n")
    stand_in = TorchStandIn(fake_torch, MIB, 0.5)
    try:
        with pytest.raises(StandInError, match=r"did not start within 0\.5 s"):
            stand_in.start()
    finally:
        stand_in.stop()


def test_a_stand_in_whose_allocation_nvml_never_sees_fails_the_check(
    fake_torch: GpuInfo,
) -> None:
    """The whole check with the real stand-in process: a fake torch allocates nothing the mock
    NVML sees, so the agent measures 0 for a known 1Gi, which must not pass."""
    out = io.StringIO()
    code = main(["--measure", "1Gi", "--settle-seconds", "0"], {}, nvml=Gpus().module, out=out)
    assert code == Outcome.MEASUREMENT_OFF
    assert "measured 0 bytes for a load of exactly 1073741824" in out.getvalue()
    assert "torch 0.0-fake on Fake GPU 80GB" in out.getvalue()
