"""Benchmark: how often can one model's load, or one pod's requests, take the node's Triton down?
(crash quarantine)

One node: the simulated API server, a real Triton on the CPU (restarted as the kubelet restarts a
crashed container, as soon as it exits) and the agent in-process over a mock NVML. A victim model
(`add_one`) is loaded and served; then a second pod's model, whose Python `initialize` kills
`tritonserver`, is loaded. For `--seconds` the script counts Triton's restarts and times, from
the first crash, how long until the victim's model is READY again and stays READY through the
end of the window, and whether the crasher ends quarantined. With `--by requests` the crasher's
model loads fine but its `execute` kills `tritonserver` on a magic input, which the crasher pod
sends through a node gateway (in-process) again and again, each time Triton is back; the victim
then counts as served when its own request through the gateway is answered 200. With `--by
delayed` the crasher's loads are READY and a thread its `initialize` starts kills `tritonserver`
4 s later, while the victim is called through the gateway (the last sender before each exit).
`victim_served_after_last_s` is from the last restart to the victim served for good.

  python -m benchmarks.crash_quarantine --quarantine-after 2 --seconds 60
  python -m benchmarks.crash_quarantine --quarantine-after 1000 --seconds 60   # no quarantine
  python -m benchmarks.crash_quarantine --by requests --quarantine-after 2 --seconds 60
  python -m benchmarks.crash_quarantine --by delayed --quarantine-after 2 --seconds 90

Prints one line per run; figures go in docs/results.md with the command and the date. Goal, with
`--quarantine-after` 2 or less: Triton exited, the crasher ends quarantined and the victim not,
and the victim is served for good within 15 s of the first crash; printed as met or NOT MET, the
run exits 1 when one is not met (`--no-goal`: 0 anyway). A larger `--quarantine-after` is the
baseline without quarantine: no goal.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
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
from benchmarks import goals
from common.contract import TENANT_CODE_NODE, Keys
from common.lifecycle import Lifecycle
from common.proofs import Claim, KeyRing
from protos import agent_pb2, agent_pb2_grpc
from proxy.gateway.app import Gateway
from proxy.gateway.settings import GatewaySettings
from sim.apiserver import start_in_thread
from sim.crashers import load_killer
from sim.gpu.nvml import MockNvml, parse_spec
from sim.triton import TritonServer

NODE = "gpu-node-1"
KEY = b"crash quarantine benchmark: placement key, not a secret"
MODELS = Path(__file__).resolve().parent.parent / "tests" / "models"
KILLER = load_killer()
DELAYED_KILLER = load_killer(4.0)
KILLERS = {"load": KILLER, "delayed": DELAYED_KILLER}
REQUEST_KILLER = """import os
import signal

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if data.max() >= 1000:
                os.kill(os.getppid(), signal.SIGKILL)
            out = pb_utils.Tensor("OUTPUT0", (data + 1).astype(data.dtype))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
"""
ADDRESSES = {"victim": "127.1.0.6", "crasher": "127.1.0.5"}
"""Each pod's address, the source of its requests to the gateway (any of 127.0.0.0/8 is local)."""


def model_dir(root: Path, name: str, killer: str) -> Path:
    target = root / name
    shutil.copytree(MODELS / "add_one", target)
    config = target / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "add_one"', f'name: "{name}"', 1))
    if killer:
        (target / "1" / "model.py").write_text(killer)
    return target


async def infer(gateway: Gateway, source: str, model_id: str, value: float) -> int:
    """One REST inference through the gateway from `source`: its status, 0 when the connection
    broke (Triton died under it, or is down)."""
    body = json.dumps(
        {"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "FP32", "data": [value]}]}
    ).encode()
    head = (
        f"POST /v2/models/{model_id}/infer HTTP/1.1\r\nHost: gateway\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    try:
        async with asyncio.timeout(30):
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", gateway.ports["http"], local_addr=(source, 0)
            )
            writer.write(head + body)
            answer = await reader.read()
            writer.close()
    except (OSError, TimeoutError):
        return 0
    return int(answer[9:12]) if answer.startswith(b"HTTP/1.1 ") else 0


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
    ip = ADDRESSES[name]
    status = {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": "127.0.0.1"}
    core.patch_namespaced_pod_status(f"{name}-pod", "default", {"status": status})


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


async def run(quarantine_after: int, seconds: float, by: str = "load") -> dict[str, Any]:
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
        # The crasher runs its own Python code in Triton: only a node dedicated to it may.
        labels = {Keys().tenant_code: TENANT_CODE_NODE}
        core.create_node({"metadata": {"name": NODE, "labels": labels}})
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
            gateway_table=work / "gateway" / "callers.json",
            gateway_table_refresh_seconds=0.5,
        )
        agent = Agent(settings, nvml=mock.as_module())
        await agent.start(lifecycle)
        gateway = Gateway(
            GatewaySettings(
                caller_table=work / "gateway" / "callers.json",
                triton_http_url=triton.http_url,
                triton_grpc_url=triton.grpc_url,
                listen_http=("127.0.0.1", 0),
                listen_grpc=("127.0.0.1", 0),
                listen_metrics=("127.0.0.1", 0),
                table_poll_seconds=0.05,
            )
        )
        await gateway.start(lifecycle)
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
            killer = "" if name == "victim" else KILLERS.get(by, REQUEST_KILLER)
            await install(stub, tokens[name], model_dir(work / "src", name, killer), name)
        auth = (("authorization", f"Bearer {tokens['victim']}"),)
        await stub.LoadModel(agent_pb2.LoadModelRequest(model_id="victim"), metadata=auth)
        victim = next(n for n, o in agent.owners.all().items() if o.model_id == "victim")
        crasher = ""
        if by == "requests":
            auth = (("authorization", f"Bearer {tokens['crasher']}"),)
            await stub.LoadModel(agent_pb2.LoadModelRequest(model_id="crasher"), metadata=auth)
            crasher = next(n for n, o in agent.owners.all().items() if o.model_id == "crasher")

        restarts = 0
        crashed_at: float | None = None
        last_crash: float | None = None
        ready_since: float | None = None
        refused = 0
        auth = (("authorization", f"Bearer {tokens['crasher']}"),)
        load = asyncio.ensure_future(
            stub.LoadModel(agent_pb2.LoadModelRequest(model_id="crasher"), metadata=auth)
            if by != "requests"
            else asyncio.sleep(0)
        )
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            if triton.exited():
                crashed_at = crashed_at or time.monotonic()
                last_crash = time.monotonic()
                ready_since = None
                restarts += 1
                await asyncio.to_thread(triton.restart)
            with contextlib.suppress(Exception):
                entry = await agent.triton.state(victim)
                served = entry is not None and entry.state == READY
                if by != "load" and served:
                    served = await infer(gateway, ADDRESSES["victim"], "victim", 1.0) == 200
                if by == "requests" and served:
                    mine = await agent.triton.state(crasher)
                    if mine is not None and mine.state == READY:  # its model is back: again
                        attack = await infer(gateway, ADDRESSES["crasher"], "crasher", 1000.0)
                        refused += attack == 503
                ready_since = (ready_since or time.monotonic()) if served else None
            await asyncio.sleep(0.05)
        with contextlib.suppress(grpc.aio.AioRpcError):
            await load
        quarantined = (
            any(r.quarantined for r in agent.crashes.records())
            if by != "requests"
            else any(r.quarantined for r in agent.crashes.callers())
        )
        return {
            "by": by,
            "quarantine_after": quarantine_after,
            "seconds": seconds,
            "triton_restarts": restarts,
            "victim_served_again_after_s": (
                round(ready_since - crashed_at, 1) if ready_since and crashed_at else None
            ),
            "victim_served_after_last_s": (
                round(ready_since - last_crash, 1) if ready_since and last_crash else None
            ),
            "crasher_quarantined": quarantined,
            "victim_quarantined": any(
                r.quarantined and r.model_id == "victim" for r in agent.crashes.callers()
            )
            or any(r.quarantined and r.model_id == "victim" for r in agent.crashes.records()),
            **({"crasher_requests_refused": refused} if by == "requests" else {}),
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
    parser.add_argument(
        "--by",
        choices=("load", "requests", "delayed"),
        default="load",
        help="what kills Triton: its load, its requests, or a thread seconds after its load",
    )
    parser.add_argument("--verbose", action="store_true", help="log the agent at INFO")
    goals.add_flag(parser)
    args = parser.parse_args(argv)
    level = logging.INFO if args.verbose else logging.ERROR
    logging.basicConfig(level=level, format="%(relativeCreated)6.0f %(name)s %(message)s")
    result = asyncio.run(run(args.quarantine_after, args.seconds, args.by))
    print(" ".join(f"{k}={v}" for k, v in result.items()))
    return goals.exit_code(check_goals(result), args.no_goal)


QUARANTINE_GOAL_AFTER = 2
"""The goal holds with `--quarantine-after` at most this (the crasher is stopped quickly)."""
SERVED_GOAL_SECONDS = 15.0
"""The victim served for good at most this long after the first crash."""


def check_goals(result: dict[str, Any]) -> list[bool]:
    """The run's goals, each printed with met or NOT MET; none without quarantine."""
    if result["quarantine_after"] > QUARANTINE_GOAL_AFTER:
        print(f"goal: none checked (it is for --quarantine-after {QUARANTINE_GOAL_AFTER} or less)")
        return []
    served = result["victim_served_again_after_s"]
    return [
        goals.check("Triton restarts", result["triton_restarts"], 1, ">="),
        goals.require("crasher quarantined", bool(result["crasher_quarantined"])),
        goals.require("victim not quarantined", not result["victim_quarantined"]),
        goals.check(
            "victim served for good after the first crash",
            float("inf") if served is None else served,
            SERVED_GOAL_SECONDS,
            unit=" s",
        ),
    ]


if __name__ == "__main__":
    sys.exit(main())
