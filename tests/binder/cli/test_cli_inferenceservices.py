"""`tritonshare explain isvc/NAME` against the binder and its InferenceService controller (the
simulated API server serving the chart's CRDs and KServe's, the official client): it says how
the InferenceService's status reads, the TritonModel it owns, each replica's node, GPU and model
host pod, and the GPU memory the model is booked at: the first estimate, then what it measured
once the node's agent published it; a refused one says why and that no TritonModel serves it."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from binder.app import Binder
from binder.cli.main import main as cli
from binder.cli.views import explain_target
from common.contract import Keys
from common.tritonname import private_triton_name
from tests.binder.inferenceservices import test_inferenceservices as isvcs
from tests.binder.objects import GI
from tests.binder.simcluster import eventually
from tests.fixtures_sim import PlacementKeys

NS = isvcs.NS
NAME = "example-onnx-mnist"

# The API server serving KServe's CRDs, the binder with ModelMesh's runtime and storage-config,
# and the custom objects client, as the InferenceService tests have them.
apiserver = isvcs.apiserver
binder = isvcs.binder
custom = isvcs.custom


def _cli(kubeconfig: Path, keys: PlacementKeys, *args: str) -> tuple[int, str]:
    out = io.StringIO()
    argv = ["--kubeconfig", str(kubeconfig), "--placement-key-dir", str(keys.directory)]
    code = cli([*argv, *args], out=out)
    return code, out.getvalue()


async def test_explain_shows_its_tritonmodel_placement_and_measured_size(
    binder: Binder, custom: Any, core: Any, kubeconfig: Path, placement_keys: PlacementKeys
) -> None:
    isvcs.create(custom, isvcs.isvc(NAME, isvcs.MNIST))

    def placed() -> dict[str, Any] | None:
        entries = ((isvcs.tritonmodel(custom, NAME) or {}).get("status") or {}).get("placements")
        return entries[0] if entries else None

    entry = await eventually(placed, what="its replica placed")
    await eventually(
        lambda: (
            isvcs.model_status(custom, NAME).get("states", {}).get("activeModelState") == "Loading"
        ),
        what="Loading",
    )
    # The binder places the replica before it creates its model host pod.
    await eventually(lambda: isvcs._has_host(core, entry["host"]), what="the host pod")
    code, text = _cli(kubeconfig, placement_keys, "explain", f"isvc/{NAME}", "-n", NS)
    assert code == 0, text
    index = next(
        g["index"] for g in json.loads(_cli(kubeconfig, placement_keys, "status", "-o", "json")[1])
        ["nodes"][0]["gpus"]
    )  # fmt: skip
    host = entry["host"]
    where = f"Replica 0 is placed on node {entry['node']}, GPU {index} ({entry['gpu']}), model "
    assert text.splitlines() == [
        f"InferenceService {NS}/{NAME} reads Ready False (Loading: the model is loading); its "
        f"model: Loading, InProgress.",
        f"Its clients call grpc://modelmesh-serving.{NS}:8033 with model name {NAME}.",
        f"It is served as TritonModel {NS}/{NAME}:",
        f"TritonModel {NS}/{NAME} asks for 1Gi of GPU memory per replica for model {NAME}; 1 "
        f"wanted.",
        "It declares no GPU memory and its files are not measured yet: its next replica is "
        "booked at the first estimate, 1Gi, until one has loaded.",
        f"{where}host pod {host}; not served: not loaded on its model host yet.",
    ], text

    # The node's agent measures the replica at its load and publishes it; the host serves it.
    uid = isvcs.tritonmodel(custom, NAME)["metadata"]["uid"]  # type: ignore[index]
    usage = {entry["gpu"]: {"used": 4 * GI, "models": {private_triton_name(NS, NAME, f"{uid}/0"):
                                                         3 * GI}}}  # fmt: skip
    core.patch_node(
        entry["node"], {"metadata": {"annotations": {Keys().gpu_usage: json.dumps(usage)}}}
    )
    isvcs.set_loaded(core, host, NAME)
    await eventually(
        lambda: (
            isvcs.model_status(custom, NAME).get("states", {}).get("activeModelState") == "Loaded"
            and ((isvcs.tritonmodel(custom, NAME) or {}).get("status") or {})
            .get("gpuMemory", {})
            .get("measured")
            == "3Gi"
        ),
        what="Loaded and measured",
    )
    for words in ([f"isvc/{NAME}", "-n", NS], ["inferenceservice", f"{NS}/{NAME}"]):
        code, text = _cli(kubeconfig, placement_keys, "explain", *words)
        assert code == 0, text
        assert text.splitlines() == [
            f"InferenceService {NS}/{NAME} reads Ready True (Loaded: 1 copies loaded); its "
            f"model: Loaded, UpToDate.",
            f"Its clients call grpc://modelmesh-serving.{NS}:8033 with model name {NAME}.",
            f"It is served as TritonModel {NS}/{NAME}:",
            f"TritonModel {NS}/{NAME} asks for 3.3Gi of GPU memory per replica for model "
            f"{NAME}; 1 wanted.",
            "It declares no GPU memory: its files measured 3Gi at their load, so its next "
            "replica is booked at 3380Mi (the measure and its margin; first estimate 1Gi).",
            f"{where}host pod {host}; served.",
        ], text

    code, data = _cli(kubeconfig, placement_keys, "explain", f"isvc/{NS}/{NAME}", "-o", "json")
    document = json.loads(data)
    assert document["activeModelState"] == "Loaded"
    model = document["tritonModel"]
    assert model["tritonModel"] == f"{NS}/{NAME}"
    assert model["gpuMemory"]["source"] == "Measured"
    assert model["gpuMemory"]["measured"] == "3Gi"
    (replica,) = model["placements"]
    assert replica["placed"]["node"] == entry["node"] and replica["placed"]["host"] == host


async def test_explain_of_a_refused_one_says_why_and_that_no_tritonmodel_serves_it(
    binder: Binder, custom: Any, kubeconfig: Path, placement_keys: PlacementKeys
) -> None:
    predictor = {"model": {"modelFormat": {"name": "tensorflow"}, "storageUri": "s3://b/tf"}}
    isvcs.create(custom, isvcs.isvc("tf", predictor))
    await eventually(
        lambda: (
            isvcs.conditions(isvcs.read_isvc(custom, "tf")).get("Ready", ("", ""))[1]
            == "NoSupportingRuntime"
        ),
        what="refused",
    )
    code, text = _cli(kubeconfig, placement_keys, "explain", "isvc/tf", "-n", NS)
    assert code == 0, text
    lines = text.splitlines()
    assert lines[0].startswith(f"InferenceService {NS}/tf reads Ready False (NoSupportingRuntime: ")
    assert lines[-1].startswith("No TritonModel serves it"), text
    code, _ = _cli(kubeconfig, placement_keys, "explain", "isvc/absent", "-n", NS)
    assert code == 1


@pytest.mark.parametrize(
    ("words", "target"),
    [
        (["isvc/mnist"], ("inferenceservice", "", "mnist")),
        (["InferenceService", "mnist"], ("inferenceservice", "", "mnist")),
        (["inferenceservices/team-a/mnist"], ("inferenceservice", "team-a", "mnist")),
    ],
)
def test_explain_reads_inferenceservice_names_as_kubectl_does(
    words: list[str], target: tuple[str, str, str]
) -> None:
    assert explain_target(words) == target
