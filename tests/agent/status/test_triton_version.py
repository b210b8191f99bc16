"""The node's Triton release and backend versions on its Node: read from Triton's server metadata
(the simulated node's real Triton reports its own), mapped to an NGC release, and a later Triton's
replacing an earlier one's."""

from __future__ import annotations

import asyncio
from pathlib import Path

import kubernetes.client
import pytest

from agent.errors import TritonUnreachableError
from agent.kube.client import KubeClient
from agent.status.tritonversion import read_triton_version, triton_annotations
from common.contract import Keys
from common.tritonrelease import PINNED, release_of_server
from sim.gpu.nvml import MockNvml, parse_spec
from sim.triton import TritonServer
from tests.agent.conftest import NODE, RunningAgent, eventually
from tests.agent.status.test_node import FakeTime, node_view, publisher

KEYS = Keys()


def test_a_server_version_maps_to_its_release_and_a_known_release_to_its_backends() -> None:
    assert triton_annotations(PINNED.server, KEYS) == {
        "tritonshare.io/triton-version": "24.10",
        "tritonshare.io/tensorrt-version": PINNED.tensorrt,
        "tritonshare.io/onnxruntime-version": PINNED.onnxruntime,
    }
    # A release tritonshare has no facts for: its number only, from the monthly numbering.
    assert triton_annotations("2.54.0", KEYS) == {"tritonshare.io/triton-version": "25.01"}
    assert release_of_server("2.45.0") == "24.04"
    assert release_of_server("2.53.1") == "24.12"
    for unknown in ("2.29.0", "3.0.0", "", "dev"):
        assert release_of_server(unknown) is None
        assert triton_annotations(unknown, KEYS) == {}


class Versions:
    """A Triton that answers its server metadata after `failures` refusals."""

    def __init__(self, version: str, failures: int = 0) -> None:
        self.version = version
        self.failures = failures
        self.asked = 0

    async def server_version(self) -> str:
        self.asked += 1
        if self.asked <= self.failures:
            raise TritonUnreachableError("Triton at x does not answer GET /v2")
        return self.version


async def test_a_triton_not_answering_yet_is_asked_again_until_it_does() -> None:
    published: list[dict[str, str]] = []
    triton = Versions("2.51.0", failures=2)
    await asyncio.wait_for(
        read_triton_version(triton, KEYS, published.append, asyncio.Event(), retry_seconds=0.01),
        10,
    )
    assert triton.asked == 3
    assert published == [triton_annotations("2.51.0", KEYS)]


async def test_the_node_carries_its_tritons_versions_and_drops_an_earlier_tritons(
    kube_api: kubernetes.client.ApiClient, node: str, kubeconfig: Path
) -> None:
    stop = asyncio.Event()
    fake = FakeTime(until=1.0, stop=stop)
    mock = MockNvml(parse_spec("2xT4", seed=NODE), clock=fake.clock)
    kube = KubeClient(str(kubeconfig))
    try:
        node_publisher = publisher(kube, mock, fake)
        await node_publisher.refresh_gpus()
        node_publisher.set_triton(triton_annotations("2.51.0", KEYS))
        await node_publisher.publish()
        seen = node_view(kube_api)
        assert seen["tritonshare.io/triton-version"] == "24.10"
        assert seen["tritonshare.io/tensorrt-version"] == PINNED.tensorrt
        assert seen["tritonshare.io/onnxruntime-version"] == PINNED.onnxruntime
        # The pool's image moves to a release without known backends: 24.10's are not kept.
        later = publisher(kube, mock, fake)
        await later.refresh_gpus()
        later.set_triton(triton_annotations("2.54.0", KEYS))
        await later.publish()
        seen = node_view(kube_api)
        assert seen["tritonshare.io/triton-version"] == "25.01"
        assert "tritonshare.io/tensorrt-version" not in seen
        assert "tritonshare.io/onnxruntime-version" not in seen
        assert "tritonshare.io/gpus" in seen
    finally:
        await kube.close()


@pytest.mark.triton
async def test_an_agent_publishes_the_release_its_triton_reports(
    running: RunningAgent, triton: TritonServer, kube_api: kubernetes.client.ApiClient
) -> None:
    await eventually(
        lambda: node_view(kube_api).get("tritonshare.io/triton-version") == PINNED.release,
        what="the node's Triton release on the Node",
    )
    seen = node_view(kube_api)
    assert seen["tritonshare.io/tensorrt-version"] == PINNED.tensorrt
    assert seen["tritonshare.io/onnxruntime-version"] == PINNED.onnxruntime
