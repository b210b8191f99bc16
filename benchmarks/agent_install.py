"""Agent benchmark: install throughput of a 1 GiB model directory, and the agent's load overhead
over a direct Triton load of the same model, side by side, medians of several runs.

    .venv/bin/python -m benchmarks.agent_install [--size-mib 1024] [--runs 5] [--chunk-kib 1024]
        [--no-goal]

Runs the real pieces: sim/'s API server, a real Triton (nvidia-pytriton) on the CPU, and the agent
as a process (`python -m sim.gpu.agent_node --gpus 2xT4 -- ... --cpu-only`). The client streams the
files over gRPC as the loader does, with a projected token minted for the model's pod. Each
install run writes everything anew (the model is unloaded and removed between runs); the load
comparison alternates a direct `POST /v2/repository/models/<name>/load` of the pod's model (its
private name in Triton, with the config override the agent sends) with the agent's LoadModel
(which also parses config.pbtxt, checks it, pins the instances and measures the GPU).

The goals (checked unless `--no-goal`): the median install at least `INSTALL_GOAL_MBPS` MB/s,
and the agent's LoadModel at most `LOAD_OVERHEAD_GOAL_MS` over the direct load (medians).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import kubernetes.client

from agent.installs.modelconfig import override_json, parse_config, pinned_config
from benchmarks import command_line, goals
from common.contract import TENANT_CODE_NODE, Keys
from common.proofs import Claim, load_key_ring
from common.tritonname import private_triton_name
from protos import agent_pb2, agent_pb2_grpc
from sim.apiserver import start_in_thread
from sim.cluster import write_placement_keys
from sim.triton import TritonServer

ROOT = Path(__file__).resolve().parent.parent
MODEL = "bench"
NODE = "bench-node"
KEYS = Keys()
INSTALL_GOAL_MBPS = 200.0
"""MB/s: the median install of a model directory (a 1 GiB model in about 5 s)."""
LOAD_OVERHEAD_GOAL_MS = 250.0
"""Milliseconds the agent's LoadModel may take over Triton's own load of the same model (its
config check, pinning and GPU reading), medians."""


def check_goals(install_mbps: float, overhead_ms: float) -> list[bool]:
    """The median install throughput and the agent's load overhead against their goals."""
    return [
        goals.check("install throughput", install_mbps, INSTALL_GOAL_MBPS, ">=", " MB/s"),
        goals.check(
            "agent LoadModel over the direct load", overhead_ms, LOAD_OVERHEAD_GOAL_MS, unit=" ms"
        ),
    ]


def make_model(directory: Path, size_mib: int) -> list[tuple[str, int, str]]:
    """add_one under the name `bench`, plus a weights file of `size_mib` MiB; its manifest."""
    shutil.copytree(ROOT / "tests" / "models" / "add_one", directory)
    config = directory / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "add_one"', f'name: "{MODEL}"', 1))
    block = os.urandom(1024 * 1024)
    with (directory / "1" / "weights.bin").open("wb") as f:
        for i in range(size_mib):
            # Vary each MiB so nothing downstream can deduplicate or compress it away.
            f.write(i.to_bytes(8, "little") + block[8:])
    manifest = []
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        h = hashlib.sha256()
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        manifest.append(
            (path.relative_to(directory).as_posix(), path.stat().st_size, h.hexdigest())
        )
    return manifest


async def requests(
    directory: Path, manifest: list[tuple[str, int, str]], chunk: int
) -> AsyncIterator[Any]:
    yield agent_pb2.InstallModelRequest(
        header=agent_pb2.InstallHeader(
            model_id=MODEL,
            manifest=agent_pb2.Manifest(
                files=[agent_pb2.FileEntry(path=p, size=s, sha256=h) for p, s, h in manifest]
            ),
        )
    )
    for path, _, _ in manifest:
        with (directory / path).open("rb") as f:
            offset = 0
            while data := f.read(chunk):
                yield agent_pb2.InstallModelRequest(
                    chunk=agent_pb2.FileChunk(path=path, offset=offset, data=data)
                )
                offset += len(data)


def direct(triton: TritonServer, name: str, verb: str, body: bytes = b"{}") -> None:
    request = urllib.request.Request(
        f"http://{triton.http_url}/v2/repository/models/{name}/{verb}", data=body, method="POST"
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        response.read()


def load_body(source: Path, name: str) -> bytes:
    """The load the agent asks of Triton for the pod's model (named `name` in Triton): its
    config with that name and its instances on the CPU, as the load's `config` parameter."""
    config = parse_config((source / "config.pbtxt").read_text(), MODEL)
    override = override_json(pinned_config(config, name, None))
    return json.dumps({"parameters": {"config": override}}).encode()


def wait_unloaded(triton: TritonServer, name: str) -> None:
    while True:
        request = urllib.request.Request(
            f"http://{triton.http_url}/v2/repository/index", data=b"{}", method="POST"
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            index = json.loads(response.read())
        states = [m.get("state") for m in index if m["name"] == name]
        if all(s in (None, "UNAVAILABLE") for s in states):
            return
        time.sleep(0.02)


def start_process(command: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(command, cwd=ROOT)


async def measure(args: argparse.Namespace, work: Path) -> list[bool]:
    apiserver = start_in_thread()
    triton: TritonServer | None = None
    agent: subprocess.Popen[bytes] | None = None
    try:
        api = apiserver.api_client()
        core = kubernetes.client.CoreV1Api(api)
        # Dedicated to tenant code: the agent lets "default" run the Python backend.
        node: Any = {"metadata": {"name": NODE, "labels": {Keys().tenant_code: TENANT_CODE_NODE}}}
        core.create_node(node)
        pod: Any = {
            "metadata": {
                "name": "bench-pod",
                "namespace": "default",
                "annotations": {"tritonshare.io/model-id": MODEL},
            },
            "spec": {
                "nodeName": NODE,
                "schedulerName": "tritonshare",
                "containers": [{"name": "proxy", "image": "proxy"}],
            },
        }
        created: Any = core.create_namespaced_pod("default", pod)
        # Signed as the binder signs a placement: the agent serves only proven pods.
        key_dir = write_placement_keys(work / "placement-key")
        claim = Claim(created.metadata.uid, "default", "bench-pod", NODE, "", MODEL, 1 << 30)
        proof = load_key_ring(key_dir).sign(claim)
        patch: Any = {"metadata": {"annotations": {KEYS.placement: proof}}}
        core.patch_namespaced_pod("bench-pod", "default", patch)
        api.close()  # type: ignore[no-untyped-call]
        token = apiserver.mint_token("default", "bench-pod")
        metadata = (("authorization", f"Bearer {token}"),)

        source = work / "source"
        print(f"Writing a {args.size_mib} MiB model directory and hashing it ...", flush=True)
        manifest = make_model(source, args.size_mib)
        total = sum(size for _, size, _ in manifest)
        repository = work / "node" / "models"
        repository.mkdir(parents=True)
        triton = TritonServer(repository).start()
        ports = work / "ports.json"
        command = [
            sys.executable, "-m", "sim.gpu.agent_node", "--gpus", "2xT4", "--",
            "--node-name", NODE, "--kubeconfig", str(apiserver.write_kubeconfig(work / "kc")),
            "--triton-http-url", triton.http_url, "--triton-grpc-url", triton.grpc_url,
            "--model-repository", str(repository),
            "--listen-grpc", "127.0.0.1:0", "--listen-http", "127.0.0.1:0",
            "--ports-file", str(ports), "--cpu-only", "--log-level", "WARNING",
            "--placement-key-dir", str(key_dir), "--tenant-code-namespaces", "default",
        ]  # fmt: skip
        agent = start_process(command)
        deadline = time.monotonic() + 60
        while not ports.exists():
            if agent.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the agent did not start")
            await asyncio.sleep(0.05)
        address = json.loads(ports.read_text())["grpc"]
        options = [("grpc.max_send_message_length", 64 << 20)]
        async with grpc.aio.insecure_channel(address, options=options) as channel:
            stub = agent_pb2_grpc.AgentStub(channel)
            installs = []
            for run in range(args.runs):
                started = time.perf_counter()
                reply = await stub.InstallModel(
                    requests(source, manifest, args.chunk_kib * 1024), metadata=metadata
                )
                seconds = time.perf_counter() - started
                assert reply.bytes_written == total and not reply.unchanged
                installs.append(seconds)
                print(f"  install run {run + 1}: {total / seconds / 1e6:.0f} MB/s", flush=True)
                if run < args.runs - 1:
                    await stub.UnloadModel(
                        agent_pb2.UnloadModelRequest(model_id=MODEL), metadata=metadata
                    )
            started = time.perf_counter()
            reply = await stub.InstallModel(
                requests(source, manifest, args.chunk_kib * 1024), metadata=metadata
            )
            unchanged = time.perf_counter() - started
            assert reply.unchanged

            # The agent installs the pod's model under the pod's private name in Triton.
            name = private_triton_name("default", MODEL, created.metadata.uid)
            body = load_body(source, name)
            direct_loads, agent_loads = [], []
            for _ in range(args.runs):
                started = time.perf_counter()
                direct(triton, name, "load", body)
                direct_loads.append(time.perf_counter() - started)
                direct(triton, name, "unload")
                wait_unloaded(triton, name)
                started = time.perf_counter()
                status = await stub.LoadModel(
                    agent_pb2.LoadModelRequest(model_id=MODEL), metadata=metadata
                )
                agent_loads.append(time.perf_counter() - started)
                assert status.state == agent_pb2.MODEL_STATE_READY, status.reason
                direct(triton, name, "unload")
                wait_unloaded(triton, name)

        install = statistics.median(installs)
        load_direct = statistics.median(direct_loads)
        load_agent = statistics.median(agent_loads)
        print()
        print(f"model directory: {total / (1 << 20):.0f} MiB in {len(manifest)} files, "
              f"{args.chunk_kib} KiB chunks, {args.runs} runs, medians")  # fmt: skip
        print(f"{'':34}{'median':>12}{'min':>12}{'max':>12}")
        row = "{:34}{:>12}{:>12}{:>12}"
        print(row.format(
            "install throughput (MB/s)",
            *(f"{total / s / 1e6:.0f}" for s in (install, max(installs), min(installs))),
        ))  # fmt: skip
        print(row.format("install, same manifest again (ms)", f"{unchanged * 1e3:.1f}", "", ""))
        print(row.format("direct Triton load (ms)", *(f"{v * 1e3:.0f}" for v in
              (load_direct, min(direct_loads), max(direct_loads)))))  # fmt: skip
        print(row.format("agent LoadModel (ms)", *(f"{v * 1e3:.0f}" for v in
              (load_agent, min(agent_loads), max(agent_loads)))))  # fmt: skip
        print(f"agent load overhead: {(load_agent - load_direct) * 1e3:+.0f} ms "
              f"({load_agent / load_direct:.2f}x the direct load)")  # fmt: skip
        return check_goals(total / install / 1e6, (load_agent - load_direct) * 1e3)
    finally:
        if agent is not None and agent.poll() is None:
            agent.send_signal(signal.SIGTERM)
            agent.wait(60)
        if triton is not None:
            triton.stop()
        apiserver.stop()


def main() -> int:
    parser = command_line(
        "agent_install",
        (
            "Measures the agent's install throughput for a model directory of --size-mib MiB "
            "sent in --chunk-kib KiB chunks, and the agent's load overhead over a direct "
            "Triton load of the same model; medians of --runs runs, side by side, against "
            "sim/'s API server and a real Triton."
        ),
    )
    parser.add_argument("--size-mib", type=int, default=1024, help="weights file size, MiB")
    parser.add_argument("--runs", type=int, default=5, help="runs of each measurement")
    parser.add_argument("--chunk-kib", type=int, default=1024, help="chunk size, KiB")
    goals.add_flag(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tritonshare-bench-") as work:
        verdicts = asyncio.run(measure(args, Path(work)))
    return goals.exit_code(verdicts, args.no_goal)


if __name__ == "__main__":
    sys.exit(main())
