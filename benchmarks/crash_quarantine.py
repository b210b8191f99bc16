"""Benchmark: how often can one model's load take the node's Triton down? (crash quarantine)

One node: the simulated API server, a real Triton on the CPU (restarted as the kubelet restarts a
crashed container, as soon as it exits) and the agent in-process over a mock NVML. A victim model
(`add_one`) is loaded and served; then a second pod's model, whose Python `initialize` kills
`tritonserver`, is loaded. For `--seconds` the script counts Triton's restarts and times, from
the first crash, how long until the victim's model is READY again and stays READY through the
end of the window, and whether the crasher ends quarantined.

  python -m benchmarks.crash_quarantine --quarantine-after 2 --seconds 60
  python -m benchmarks.crash_quarantine --quarantine-after 1000 --seconds 60   # no quarantine

Prints one line per run; figures go in docs/results.md with the command and the date.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import kubernetes.client

from agent.app import Agent
from agent.settings import Settings
from agent.triton import READY
from common.lifecycle import Lifecycle
from common.placement import Claim, KeyRing
from protos import agent_pb2, agent_pb2_grpc
from sim.apiserver import start_in_thread
from sim.gpu.nvml import MockNvml, parse_spec
from sim.triton import TritonServer

NODE = "gpu-node-1"
KEY = b"crash quarantine benchmark: placement key, not a secret"
MODELS = Path(__file__).resolve().parent.parent / "tests" / "models"
KILLER = """import os
import signal


class TritonPythonModel:
    def initialize(self, args):
        os.kill(os.getppid(), signal.SIGKILL)

    def execute(self, requests):
        return []
"""


def model_dir(root: Path, name: str, killer: bool) -> Path:
    target = root / name
    shutil.copytree(MODELS / "add_one", target)
    config = target / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "add_one"', f'name: "{name}"', 1))
    if killer:
        (target / "1" / "model.py").write_text(KILLER)
    return target


def make_pod(api: kubernetes.client.ApiClient, name: str, gpu: str) -> None:
    core: Any = kubernetes.client.CoreV1Api(api)
    annotations = {"tritonshare.io/model-id": name, "tritonshare.io/gpu": gpu}
    core.create_namespaced_pod(
        "default",
        {
            "metadata": {"name": f"{name}-pod", "annotations": annotations},
            "spec": {
                "nodeName": NODE,
                "schedulerName": "tritonshare",
                "containers": [{"name": "proxy", "image": "tritonshare/proxy"}],
            },
        },
    )
    pod = core.read_namespaced_pod(f"{name}-pod", "default")
    claim = Claim(pod.metadata.uid, "default", f"{name}-pod", NODE, gpu, name, 1024**3)
    proof = KeyRing(KEY).sign(claim)
    core.patch_namespaced_pod(
        f"{name}-pod", "default", {"metadata": {"annotations": {"tritonshare.io/placement": proof}}}
    )
    core.patch_namespaced_pod_status(f"{name}-pod", "default", {"status": {"phase": "Running"}})


def read_files(directory: Path) -> list[tuple[str, bytes]]:
    return [
        (path.relative_to(directory).as_posix(), path.read_bytes())
        for path in sorted(p for p in directory.rglob("*") if p.is_file())
    ]


async def install(stub: Any, token: str, directory: Path, model_id: str) -> None:
    files = read_files(directory)

    async def requests() -> Any:
        entries = [
            agent_pb2.FileEntry(path=p, size=len(d), sha256=hashlib.sha256(d).hexdigest())
            for p, d in files
        ]
        yield agent_pb2.InstallModelRequest(
            header=agent_pb2.InstallHeader(
                model_id=model_id, manifest=agent_pb2.Manifest(files=entries)
            )
        )
        for p, d in files:
            yield agent_pb2.InstallModelRequest(chunk=agent_pb2.FileChunk(path=p, offset=0, data=d))

    await stub.InstallModel(requests(), metadata=(("authorization", f"Bearer {token}"),))


async def run(quarantine_after: int, seconds: float) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="crash-quarantine-"))
    apiserver = start_in_thread()
    api = apiserver.api_client()
    triton = TritonServer(work / "repository")
    triton.model_repository.mkdir()
    triton.start()
    lifecycle = Lifecycle(cleanup_timeout=20)
    channel: grpc.aio.Channel | None = None
    try:
        core: Any = kubernetes.client.CoreV1Api(api)
        core.create_node({"metadata": {"name": NODE}})
        (work / "keys").mkdir()
        (work / "keys" / "current").write_bytes(KEY)
        mock = MockNvml(parse_spec("2xT4", seed=NODE))
        settings = Settings(
            node_name=NODE,
            model_repository=triton.model_repository,
            kubeconfig=str(apiserver.write_kubeconfig(work / "kubeconfig")),
            triton_http_url=triton.http_url,
            triton_grpc_url=triton.grpc_url,
            listen_grpc="127.0.0.1:0",
            listen_http="127.0.0.1:0",
            cpu_only=True,
            triton_poll_seconds=0.2,
            resync_seconds=1.0,
            placement_key_dir=work / "keys",
            tenant_code_namespaces=("default",),
            crash_quarantine_after=quarantine_after,
        )
        agent = Agent(settings, nvml=mock.as_module())
        await agent.start(lifecycle)
        deadline = time.monotonic() + 60
        while agent.not_ready() and time.monotonic() < deadline:  # noqa: ASYNC110 (a poll)
            await asyncio.sleep(0.05)
        channel = grpc.aio.insecure_channel(agent.grpc_address)
        stub = agent_pb2_grpc.AgentStub(channel)
        gpu = mock.gpus[0].uuid
        tokens = {}
        for name in ("victim", "crasher"):
            make_pod(api, name, gpu)
            tokens[name] = apiserver.mint_token("default", f"{name}-pod")
            await install(
                stub, tokens[name], model_dir(work / "src", name, name == "crasher"), name
            )
        auth = (("authorization", f"Bearer {tokens['victim']}"),)
        await stub.LoadModel(agent_pb2.LoadModelRequest(model_id="victim"), metadata=auth)
        victim = next(n for n, o in agent.owners.all().items() if o.model_id == "victim")

        restarts = 0
        crashed_at: float | None = None
        ready_since: float | None = None
        auth = (("authorization", f"Bearer {tokens['crasher']}"),)
        load = asyncio.ensure_future(
            stub.LoadModel(agent_pb2.LoadModelRequest(model_id="crasher"), metadata=auth)
        )
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            if triton.exited():
                crashed_at = crashed_at or time.monotonic()
                ready_since = None
                restarts += 1
                await asyncio.to_thread(triton.restart)
            with contextlib.suppress(Exception):
                entry = await agent.triton.state(victim)
                if entry is not None and entry.state == READY:
                    ready_since = ready_since or time.monotonic()
                else:
                    ready_since = None
            await asyncio.sleep(0.05)
        with contextlib.suppress(grpc.aio.AioRpcError):
            await load
        return {
            "quarantine_after": quarantine_after,
            "seconds": seconds,
            "triton_restarts": restarts,
            "victim_served_again_after_s": (
                round(ready_since - crashed_at, 1) if ready_since and crashed_at else None
            ),
            "crasher_quarantined": bool(agent.crashes.records())
            and any(r.quarantined for r in agent.crashes.records()),
        }
    finally:
        if channel is not None:
            await channel.close(None)
        lifecycle.request_stop("benchmark over")
        await lifecycle.shutdown()
        triton.discard()
        api.close()  # type: ignore[no-untyped-call]
        apiserver.stop()
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quarantine-after", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--verbose", action="store_true", help="log the agent at INFO")
    args = parser.parse_args(argv)
    level = logging.INFO if args.verbose else logging.ERROR
    logging.basicConfig(level=level, format="%(relativeCreated)6.0f %(name)s %(message)s")
    result = asyncio.run(run(args.quarantine_after, args.seconds))
    print(" ".join(f"{k}={v}" for k, v in result.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
