"""The NVML relay (`--gpu-source=triton`): NVML read in Triton's container and answered over a
Unix socket, so the agent's own container needs no GPU and no NVIDIA_VISIBLE_DEVICES.

The relay runs here over the mock NVML (the only GPU mock), in a thread standing in for Triton's
container; the agent's real reading code (`agent.gpus.nvml`) reads through it. The installed relay
also runs as Triton's container runs it: a file of its own, with another Python, beside the
pynvml it was installed with."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import kubernetes.client
import pytest

from agent import gpucheck
from agent.app import Agent
from agent.errors import AgentError, NvmlUnavailableError
from agent.gpus.nvml import GpuReader
from agent.gpus.relay import Relay, install
from agent.gpus.relayclient import RelayedNvml
from agent.settings import Settings
from common.contract import Keys
from common.lifecycle import Lifecycle
from sim.gpu.nvml import MockNvml, parse_spec
from sim.triton import TritonServer
from tests.agent.conftest import NODE, agent_settings, eventually, make_node, start_agent
from tests.agent.gpus.test_foreign import node_events
from tests.fixtures_sim import write_test_placement_key
from tests.gpu.test_gpucheck import Gpus


@pytest.fixture
def socket_path() -> Iterator[Path]:
    # A Unix socket's path has at most 107 bytes: pytest's tmp_path can be longer.
    directory = Path(tempfile.mkdtemp(prefix="nvml-", dir="/tmp"))
    yield directory / "nvml.sock"
    shutil.rmtree(directory, ignore_errors=True)


@contextlib.contextmanager
def relay(path: Path, mock: MockNvml | ModuleType) -> Iterator[Relay]:
    """The relay over the mock NVML, serving in a thread (Triton's container in the tests)."""
    server = Relay(path, mock.as_module() if isinstance(mock, MockNvml) else mock)
    thread = threading.Thread(target=server.serve_forever, name="nvml-relay", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def relayed(path: Path) -> GpuReader:
    return GpuReader(nvml=RelayedNvml(path, timeout=5), remedy="start the relay")


def test_the_relay_answers_what_nvml_answers(socket_path: Path) -> None:
    mock = MockNvml(parse_spec("2xT4", seed=NODE))
    direct = GpuReader(nvml=mock.as_module())
    with relay(socket_path, mock):
        assert oct(socket_path.stat().st_mode & 0o777) == oct(0o660), "the pod's group only"
        reader = relayed(socket_path)
        try:
            mock.set_used(1, 3 << 30)
            assert reader.read() == direct.read()
            assert reader.driver_version() == direct.driver_version()
            mock.add_process(1, 4242, 1 << 30)
            mock.add_process(1, 4343, None, kind="graphics")
            assert reader.processes(1) == direct.processes(1)
            assert [p.pid for p in reader.processes(1)] == [4242, 4343]

            # A lost GPU is one unhealthy GPU, with NVML's reason, as with NVML itself.
            mock.lose_gpu(0)
            lost, seen = reader.read().gpus[0], direct.read().gpus[0]
            assert not lost.healthy and lost.reason.endswith(": GPU is lost"), lost
            assert lost == replace(seen, reason=lost.reason), "identity kept from the last reading"
            mock.recover_gpu(0)
            assert reader.read().gpus[0].healthy

            # NVML unusable in Triton's container: the whole reading fails, saying so.
            mock.set_library_loaded(False)
            with pytest.raises(NvmlUnavailableError, match="start the relay"):
                reader.read()
            mock.set_library_loaded(True)
            assert len(reader.read().gpus) == 2
        finally:
            reader.close()


def test_a_relay_that_is_gone_or_lies_is_nvml_that_cannot_be_used(socket_path: Path) -> None:
    mock = MockNvml(parse_spec("1xT4", seed=NODE))
    reader = relayed(socket_path)
    with pytest.raises(NvmlUnavailableError, match=r"does not answer on .*nvml\.sock"):
        reader.read()
    with relay(socket_path, mock):
        assert len(reader.read().gpus) == 1, "the reader connects once the relay is there"
    with pytest.raises(NvmlUnavailableError, match="does not answer"):
        reader.read()
    with relay(socket_path, mock):
        assert len(reader.read().gpus) == 1, "and again after a restart of Triton's container"
    reader.close()

    # Something else on the socket (the relay runs beside tenants' models): answers of the
    # wrong shape or size are refused, never used.
    for answer in (
        b'{"ok": "two"}\n',
        b'{"ok": -1.5}\n',
        b"[1]\n",
        b"not json\n",
        b'{"error": "x"}\n',
        b'{"ok": ' + b"1" * (1 << 20) + b"}\n",
    ):
        listener = _lying_server(socket_path, answer)
        lied_to = relayed(socket_path)
        with pytest.raises(NvmlUnavailableError, match="does not answer on"):
            lied_to.read()
        lied_to.close()
        listener.join(timeout=10)
    # One that never answers (NVML hung on a failing GPU): the reading fails when its time is up.
    listener = _lying_server(socket_path, b"")
    waiting = GpuReader(nvml=RelayedNvml(socket_path, timeout=0.2))
    with pytest.raises(NvmlUnavailableError, match="timed out"):
        waiting.read()
    listener.join(timeout=10)


def _lying_server(path: Path, answer: bytes) -> threading.Thread:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)

    def serve() -> None:
        with server:
            connection, _ = server.accept()
            with connection, contextlib.suppress(OSError):
                while connection.recv(4096):
                    connection.sendall(answer)

    thread = threading.Thread(target=serve, name="lying-relay", daemon=True)
    thread.start()
    return thread


def test_the_installed_relay_runs_alone_with_another_python(socket_path: Path) -> None:
    """As Triton's container runs it: the files the init container installs, run by a Python
    without the tritonshare package (and, here, without a GPU: NVML's own error comes back)."""
    python = shutil.which("python3", path="/usr/bin:/usr/local/bin")
    if python is None:
        pytest.skip("no system python3 to stand in for Triton's image")
    installed = socket_path.parent / "relay"
    install(installed)
    assert sorted(p.name for p in installed.iterdir()) == [
        "nvmlrelay.py",
        "pynvml.py",
        "tritonkeeper.py",
    ]
    # Triton's keeper, installed beside it, runs with that Python alone too.
    keeper = subprocess.run(
        [python, "-B", str(installed / "tritonkeeper.py"), "--help"],
        cwd=installed,
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert keeper.returncode == 0 and "COMMAND" in keeper.stdout, keeper.stderr
    process = subprocess.Popen(
        [python, "-B", str(installed / "nvmlrelay.py"), "--socket", str(socket_path)],
        cwd=installed,
        env={"PATH": "/usr/bin:/bin"},
        stderr=subprocess.PIPE,
    )
    reader = relayed(socket_path)
    try:
        deadline = 30.0
        while not socket_path.is_socket():
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            deadline -= 0.05
            assert deadline > 0, "the relay did not start"
            threading.Event().wait(0.05)
        with pytest.raises(NvmlUnavailableError) as unusable:
            reader.read()
        assert "NVML Shared Library Not Found" in str(unusable.value), unusable.value
    finally:
        reader.close()
        process.terminate()
        process.wait(timeout=10)
        if process.stderr:
            process.stderr.close()


async def test_the_agent_reads_its_gpus_and_foreign_processes_through_the_relay(
    kubeconfig: Path,
    triton: TritonServer,
    model_repository: Path,
    node: str,
    kube_api: kubernetes.client.ApiClient,
    socket_path: Path,
    tmp_path: Path,
) -> None:
    assert triton.process is not None
    pid_file = tmp_path / "triton.pid"
    pid_file.write_text(str(triton.process.pid))
    mock = MockNvml(parse_spec("2xT4", seed=NODE))
    settings = agent_settings(
        kubeconfig,
        triton,
        model_repository,
        cpu_only=False,
        gpu_source="triton",
        nvml_relay_socket=socket_path,
        triton_pid_file=pid_file,
    )
    # The agent's own NVML would see no GPU: everything comes through the relay.
    unloaded = MockNvml(parse_spec("2xT4", seed=NODE))
    unloaded.set_library_loaded(False)
    agent = Agent(settings, nvml=unloaded.as_module())
    lifecycle = Lifecycle(cleanup_timeout=20)
    starting = asyncio.create_task(agent.start(lifecycle))
    try:
        # Started before the relay (Triton's container starts it), the agent waits for it.
        await eventually(lambda: "does not answer" in agent.node.nvml_error, what="a first try")
        assert not starting.done()
        with relay(socket_path, mock):
            await starting
            await eventually(lambda: not agent.not_ready(), what="the agent to be ready")

            def published() -> str:
                node_object = kubernetes.client.CoreV1Api(kube_api).read_node(NODE)
                assert node_object.metadata is not None
                return str((node_object.metadata.annotations or {}).get(Keys().gpus, ""))

            # Ready once the GPUs are read; the Node is written just after.
            await eventually(lambda: bool(published()), what="the GPUs published on the Node")
            gpus = published()
            assert all(g.uuid in gpus for g in mock.gpus), gpus

            mock.add_process(0, triton.process.pid, 500 << 20)
            mock.add_process(1, os.getpid(), 1 << 30)
            await eventually(lambda: len(node_events(kube_api)) == 1, what="ForeignGPUProcess")
            message = node_events(kube_api)[0]
            assert f"process {os.getpid()} holds {1 << 30} bytes on GPU 1" in message, message
            sample = agent.metrics.registry.get_sample_value
            counted = {"gpu": "1", "UUID": mock.gpus[1].uuid}
            assert sample("tritonshare_agent_gpu_foreign_processes", counted) == 1
            assert (
                sample(
                    "tritonshare_agent_gpu_foreign_processes",
                    {"gpu": "0", "UUID": mock.gpus[0].uuid},
                )
                == 0
            )
            lifecycle.request_stop("test over")
            await lifecycle.shutdown()
    finally:
        if not starting.done():
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await starting
        lifecycle.request_stop("test over")
        await lifecycle.shutdown()


async def test_the_agent_refuses_to_start_on_fewer_gpus_than_the_node_advertises(
    kube_api: kubernetes.client.ApiClient, kubeconfig: Path, tmp_path: Path, socket_path: Path
) -> None:
    make_node(kube_api, tenant_code=False)
    kubernetes.client.CoreV1Api(kube_api).patch_node_status(
        NODE, {"status": {"allocatable": {"nvidia.com/gpu": "2"}}}
    )
    settings = Settings(
        node_name=NODE,
        model_repository=tmp_path / "models",
        kubeconfig=str(kubeconfig),
        triton_http_url="127.0.0.1:9",
        triton_grpc_url="127.0.0.1:9",
        listen_grpc="127.0.0.1:0",
        listen_http="127.0.0.1:0",
        placement_key_dir=write_test_placement_key(tmp_path / "placement-key"),
        gpu_source="triton",
        nvml_relay_socket=socket_path,
    )
    mock = MockNvml(parse_spec("1xT4", seed=NODE))
    with relay(socket_path, mock), pytest.raises(AgentError) as refused:
        await start_agent(settings, MockNvml(parse_spec("2xT4", seed=NODE)))
    message = str(refused.value)
    assert "advertises 2 GPUs (nvidia.com/gpu) but NVML in Triton's container shows 1" in message
    assert "request nvidia.com/gpu: 2" in message, message
    with relay(socket_path, MockNvml(parse_spec("2xT4", seed=NODE))):
        running = await start_agent(replace(settings), MockNvml(parse_spec("1xT4", seed=NODE)))
        await running.stop()


def test_gpucheck_in_the_agents_container_reads_where_the_agent_reads(socket_path: Path) -> None:
    """`kubectl exec -c agent -- python -m agent.gpucheck --reserve` follows the agent's
    TRITONSHARE_GPU_SOURCE: through the relay it reports what NVML itself reports."""
    gpus = Gpus()
    gpus.mig[1] = (0, 0)
    gpus.mock.set_used(0, 600 << 20)
    gpus.processes[0] = {4000: 600 << 20}
    direct = io.StringIO()
    expected = gpucheck.main(["--reserve", "--json"], {}, nvml=gpus.module, out=direct)
    # NVML in the agent's own container would fail: the relay is what answers.
    unloaded = MockNvml(parse_spec("2xT4", seed=NODE))
    unloaded.set_library_loaded(False)
    env = {"TRITONSHARE_GPU_SOURCE": "triton", "TRITONSHARE_NVML_RELAY_SOCKET": str(socket_path)}
    through = io.StringIO()
    with relay(socket_path, gpus.module):
        code = gpucheck.main(["--reserve", "--json"], env, nvml=unloaded.as_module(), out=through)
    assert code == expected
    report = json.loads(through.getvalue())
    assert report == json.loads(direct.getvalue())
    assert report["baselines"][0]["held_by_processes"] == 600 << 20, report
