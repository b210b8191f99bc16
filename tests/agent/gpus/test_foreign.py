"""Processes on the node's GPUs that are not its Triton, through the mock NVML (which lists
processes as pynvml does): counted per GPU, reported once each with a Warning Event on the Node,
and never Triton's own tree."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import kubernetes.client
from prometheus_client import generate_latest

from agent.gpus.foreign import EVENT_REASON, ForeignWatch
from agent.gpus.nvml import GpuReader
from agent.gpus.processes import TritonProcesses
from agent.kube.client import KubeClient
from agent.metrics import AgentMetrics
from sim.gpu.nvml import MockNvml, parse_spec
from sim.triton import TritonServer
from tests.agent.conftest import NODE, StartAgent, eventually
from tests.executors import CallerThread


def node_events(api: kubernetes.client.ApiClient) -> list[str]:
    found = kubernetes.client.CoreV1Api(api).list_namespaced_event("default").items
    return [
        e.message or ""
        for e in found
        if e.involved_object.kind == "Node"
        and e.involved_object.name == NODE
        and e.reason == EVENT_REASON
    ]


def test_the_mock_lists_processes_as_pynvml_does() -> None:
    mock = MockNvml(parse_spec("1xT4", seed=NODE))
    module = mock.as_module()
    module.nvmlInit()
    handle = module.nvmlDeviceGetHandleByIndex(0)
    assert module.nvmlDeviceGetComputeRunningProcesses(handle) == []
    mock.add_process(0, 4242, 1 << 30)
    mock.add_process(0, 4343, None, kind="graphics")
    (compute,) = module.nvmlDeviceGetComputeRunningProcesses(handle)
    assert (compute.pid, compute.usedGpuMemory) == (4242, 1 << 30)
    assert compute.gpuInstanceId == compute.computeInstanceId == 0xFFFFFFFF
    (graphics,) = module.nvmlDeviceGetGraphicsRunningProcesses(handle)
    assert graphics.pid == 4343 and graphics.usedGpuMemory is None
    assert module.nvmlDeviceGetMemoryInfo(handle).used == 1 << 30, "its memory is used"
    mock.remove_process(0, 4242)
    assert module.nvmlDeviceGetComputeRunningProcesses(handle) == []


async def test_a_process_that_is_not_triton_s_is_counted_and_reported_once(
    kube_api: kubernetes.client.ApiClient, node: str, kubeconfig: Path, tmp_path: Path
) -> None:
    # A stand-in for Triton with a child (as a Python backend stub is): the tree is Triton's.
    child_code = "import time; time.sleep(60)"
    triton = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        f"import subprocess, sys; subprocess.run([sys.executable, '-c', {child_code!r}])",
        start_new_session=True,
    )
    pid_file = tmp_path / "triton.pid"
    pid_file.write_text(str(triton.pid))
    mock = MockNvml(parse_spec("2xT4", seed=NODE))
    reader = GpuReader(nvml=mock.as_module())
    processes = TritonProcesses(pid_file)
    kube = KubeClient(str(kubeconfig))
    metrics = AgentMetrics()
    try:
        tree = processes.tree()
        deadline = asyncio.get_running_loop().time() + 30
        while tree is None or len(tree.pids) < 2:
            assert asyncio.get_running_loop().time() < deadline, "the stand-in's child is late"
            await asyncio.sleep(0.05)
            tree = processes.tree()
        child = max(tree.pids - {triton.pid})
        watch = ForeignWatch(reader, processes, kube, NODE, period=1.0, executor=CallerThread())
        metrics.watch_foreign(watch.counts)
        mock.add_process(0, triton.pid, 300 << 20)
        mock.add_process(1, child, 200 << 20)
        snapshot = reader.read()
        assert watch.check(snapshot) == [], "Triton and its children are not foreign"
        assert watch.counts() == {("0", snapshot.gpus[0].uuid): 0, ("1", snapshot.gpus[1].uuid): 0}

        intruder = os.getpid()  # any process outside Triton's tree
        mock.add_process(1, intruder, 2 << 30)
        found = watch.check(reader.read())
        assert found is not None and [(p.gpu_index, p.pid) for p in found] == [(1, intruder)]
        await watch.report(found)
        await watch.report(watch.check(reader.read()) or [])  # still there: not again
        messages = node_events(kube_api)
        assert len(messages) == 1, messages
        assert f"process {intruder} holds {2 << 30} bytes on GPU 1" in messages[0]
        assert "is not this node's Triton" in messages[0]
        exposition = generate_latest(metrics.registry).decode()
        uuid = snapshot.gpus[1].uuid
        assert f'tritonshare_agent_gpu_foreign_processes{{UUID="{uuid}",gpu="1"}} 1.0' in exposition

        # Gone, then back: said again, the same Event (kube's rule) with its count raised.
        mock.remove_process(1, intruder)
        await watch.report(watch.check(reader.read()) or [])
        assert watch.counts()[("1", uuid)] == 0
        mock.add_process(1, intruder, 2 << 30)
        await watch.report(watch.check(reader.read()) or [])
        listed = kubernetes.client.CoreV1Api(kube_api).list_namespaced_event("default").items
        assert [e.count for e in listed if e.involved_object.kind == "Node"] == [2]

        # Triton's PID unknown: nothing is checked (a guess would blame Triton itself).
        assert (
            ForeignWatch(
                reader, TritonProcesses(None), kube, NODE, period=1.0, executor=CallerThread()
            ).check(reader.read())
            is None
        )
    finally:
        await kube.close()
        os.killpg(triton.pid, signal.SIGKILL)
        await triton.wait()


async def test_the_agent_checks_its_gpus_every_poll_and_exports_the_count(
    start_custom_agent: StartAgent,
    triton: TritonServer,
    kube_api: kubernetes.client.ApiClient,
    mock_nvml: MockNvml,
    tmp_path: Path,
) -> None:
    assert triton.process is not None
    pid_file = tmp_path / "triton.pid"
    pid_file.write_text(str(triton.process.pid))
    running = await start_custom_agent(triton_pid_file=pid_file)
    mock_nvml.add_process(0, triton.process.pid, 500 << 20)
    mock_nvml.add_process(0, os.getpid(), 1 << 30)
    await eventually(lambda: len(node_events(kube_api)) == 1, what="the ForeignGPUProcess event")
    assert f"process {os.getpid()} holds" in node_events(kube_api)[0]
    sample = running.agent.metrics.registry.get_sample_value
    uuid = mock_nvml.gpus[0].uuid
    assert sample("tritonshare_agent_gpu_foreign_processes", {"gpu": "0", "UUID": uuid}) == 1
