"""Print how long the loader takes for a first start (hash, send, load) and for a pod restart (hash,
GetModel, nothing sent), side by side, for one model size. Not a test: it asserts nothing.

    .venv/bin/python -m tests.loader.bench_restart [--mib 256] [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import grpc.aio

from protos import agent_pb2, agent_pb2_grpc
from sim.apiserver import start_in_thread
from sim.triton import TritonServer
from tests.conftest import copy_model
from tests.fixtures_sim import core_v1
from tests.loader.test_process import DEDICATED, Node, final_record, start_agent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=256, help="size of the model's weights file")
    parser.add_argument("--runs", type=int, default=3, help="runs of each kind (median shown)")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(scratch)
        repository = tmp / "repository"
        repository.mkdir()
        apiserver = start_in_thread()
        triton = TritonServer(repository)
        triton.start()
        api = apiserver.api_client()
        agent = None
        try:
            core_v1(api).create_node({"apiVersion": "v1", "kind": "Node", "metadata": DEDICATED})
            kubeconfig = apiserver.write_kubeconfig(tmp / "kubeconfig")
            node = Node(tmp, apiserver, api, kubeconfig, triton, repository)
            agent = start_agent(tmp, kubeconfig, triton, repository)
            model = copy_model("add_one", tmp / "pod")
            with (model / "1" / "weights.bin").open("wb") as weights:
                block = bytes(range(256)) * 4096
                for _ in range(options.mib):
                    weights.write(block)
            token = node.pod_token("add-one-0", "add_one")
            first: list[float] = []
            restart: list[float] = []
            for _ in range(options.runs):
                for kind in (first, restart):
                    started = time.monotonic()
                    run = node.load(model, "add_one", agent.grpc_address, token)
                    wall = time.monotonic() - started
                    assert run.returncode == 0, run.explain()
                    record = final_record(run)
                    assert record["installed"] is (kind is first)
                    kind.append(wall)
                agent_unload(agent.grpc_address, token)
            print(
                json.dumps(
                    {
                        "model_mib": options.mib,
                        "runs": options.runs,
                        "first_start_median_seconds": round(statistics.median(first), 2),
                        "restart_median_seconds": round(statistics.median(restart), 2),
                        "restart_over_first": round(
                            statistics.median(restart) / statistics.median(first), 3
                        ),
                    }
                )
            )
        finally:
            if agent is not None:
                agent.stop()
            api.close()  # type: ignore[no-untyped-call]
            triton.stop()
            apiserver.stop()


def agent_unload(address: str, token: Path) -> None:
    """Unload and remove the model so the next first start really sends it again."""

    metadata = (("authorization", f"Bearer {token.read_text()}"),)

    async def unload() -> None:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = agent_pb2_grpc.AgentStub(channel)
            await stub.UnloadModel(
                agent_pb2.UnloadModelRequest(model_id="add_one"),
                metadata=metadata,
                timeout=60,
            )

    asyncio.run(unload())


if __name__ == "__main__":
    main()
