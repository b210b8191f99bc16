"""What a simulated GPU node carries as an installed cluster's does (`sim.gpustack`): GPU feature
discovery's labels of its GPUs, mock or read through NVML, and the one node DaemonSet of
deploy/base, as kubectl renders it, that selects it and sizes it."""

from __future__ import annotations

import pytest

from common.podresources import CPU, MEMORY, pod_requests
from sim.gpu.nvml import MockNvml
from sim.gpu.spec import parse_spec
from sim.gpustack import (
    MODEL_ROOM,
    GpuStackError,
    NodeGpus,
    feature_labels,
    mock_gpus,
    node_size,
    nvml_gpus,
    render_node_daemonsets,
    selects,
)
from tests.conftest import require_executable


def test_a_mock_node_is_labelled_as_gpu_feature_discovery_labels_it() -> None:
    assert feature_labels(mock_gpus("2xT4", "gpu-node-0")) == {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.count": "2",
        "nvidia.com/gpu.product": "Tesla-T4",
        "nvidia.com/gpu.memory": "15360",
    }
    assert feature_labels(NodeGpus(0, "", 0)) == {}


def test_the_gpus_read_through_nvml_are_those_nvml_serves() -> None:
    nvml = MockNvml(parse_spec("4xH100-80GB", seed="h")).as_module()
    gpus = nvml_gpus("h", nvml)
    assert gpus == NodeGpus(4, "NVIDIA H100 80GB HBM3", 81559 << 20)
    assert feature_labels(gpus)["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"


def test_a_machine_without_a_usable_nvml_labels_no_gpus() -> None:
    """No driver here: the node is labelled as having none, and its own agent says why."""

    class NoDriver:
        class NVMLError(Exception):
            pass

        def nvmlInit(self) -> None:  # noqa: N802 (NVML's name)
            raise self.NVMLError("NVML Shared Library Not Found")

    gpus = nvml_gpus("gpu-node-0", NoDriver())
    assert gpus == NodeGpus(0, "", 0)
    assert feature_labels(gpus) == {}


def test_an_unreadable_mock_spec_names_the_node() -> None:
    with pytest.raises(GpuStackError, match="node n1's GPUs: mock NVML spec '3xZ9'"):
        mock_gpus("3xZ9", "n1")


@pytest.mark.parametrize("count", [1, 2, 4, 8])
def test_one_rendered_daemonset_selects_a_node_and_takes_all_its_gpus(count: int) -> None:
    daemonsets = render_node_daemonsets(require_executable("kubectl"))
    labels = feature_labels(NodeGpus(count, "Tesla T4", 15360 << 20))
    chosen = [d for d in daemonsets if selects(d, labels)]
    assert len(chosen) == 1, [d["metadata"]["name"] for d in chosen]
    spec = chosen[0]["spec"]["template"]["spec"]
    assert chosen[0]["metadata"]["namespace"] == "tritonshare-system"
    assert spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == str(count)
    asked = pod_requests(spec)
    assert node_size(daemonsets, labels) == {r: MODEL_ROOM[r] + asked[r] for r in (CPU, MEMORY)}


def test_a_node_no_daemonset_selects_has_only_the_model_pods_room() -> None:
    daemonsets = render_node_daemonsets(require_executable("kubectl"))
    labels = feature_labels(NodeGpus(3, "Tesla T4", 15360 << 20))
    assert not [d for d in daemonsets if selects(d, labels)]
    assert node_size(daemonsets, labels) == MODEL_ROOM
