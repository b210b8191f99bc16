"""An InferenceService's spec changes while its clients keep calling, on the simulated cluster
with the real processes (the binder, the node's agent, Triton with its ONNX Runtime stand-in, the
host's loader and proxy, an S3 API server): a client sends a KServe v2 `ModelInfer` through
`modelmesh-serving:8033` every 50 ms on one long-lived channel, as a ModelMesh client does, while
the InferenceService's storage path moves to new files, then to files Triton cannot load. No
request fails: the old files answer until the new ones are loaded, then the new ones answer; the
files that fail leave the last good ones serving, and the status says `BlockedByFailedLoad` with
the active model `Loaded` and the target one `FailedToLoad`, as ModelMesh writes it."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

import kubernetes.client
import numpy as np
import onnx
import onnxruntime
import pytest
import tritonclient.grpc as grpcclient
from numpy.typing import NDArray
from onnx import TensorProto, helper, numpy_helper
from tritonclient.utils import InferenceServerException

from sim.cluster import SimCluster
from sim.processes import wait_until
from sim.service import ServiceProxy
from tests.buckets import S3
from tests.e2e import test_modelmesh_onnx as onnx_e2e

NAMESPACE, BUCKET, KSERVE, ISVCS = (
    onnx_e2e.NAMESPACE,
    onnx_e2e.BUCKET,
    onnx_e2e.KSERVE,
    onnx_e2e.ISVCS,
)
INPUT, OUTPUT = onnx_e2e.INPUT, onnx_e2e.OUTPUT
NAME = "example-onnx-mnist"
DEADLINE = 10.0
"""Seconds a request may take before it counts as failed."""

# The S3 API server and the cluster (KServe's CRDs, the namespace labelled modelmesh-enabled), as
# the example-onnx-mnist test has them.
s3 = onnx_e2e.s3
cluster = onnx_e2e.cluster


def _mnist(seed: int) -> bytes:
    """A linear classifier with ModelMesh's mnist tensor names; `seed` picks its weights, so each
    file's answers tell it apart."""
    rng = np.random.default_rng(seed)
    graph = helper.make_graph(
        [
            helper.make_node("Flatten", [INPUT], ["flat"], axis=1),
            helper.make_node("Gemm", ["flat", "w", "b"], [OUTPUT]),
        ],
        "mnist",
        [helper.make_tensor_value_info(INPUT, TensorProto.FLOAT, ["N", 1, 28, 28])],
        [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["N", 10])],
        [
            numpy_helper.from_array(rng.normal(0, 0.05, (784, 10)).astype(np.float32), "w"),
            numpy_helper.from_array(rng.normal(0, 1, 10).astype(np.float32), "b"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.checker.check_model(model)
    return model.SerializeToString()


@dataclass(frozen=True)
class Answer:
    start: float
    version: str
    """"v1", "v2", or "" for a failed request (or numbers of neither file)."""
    detail: str = ""


class Caller:
    """One ModelMesh client: `ModelInfer` for NAME every 50 ms on one channel, each answer
    matched to the file whose numbers it carries."""

    def __init__(self, url: str, image: NDArray[Any], expected: dict[str, NDArray[Any]]) -> None:
        self.answers: list[Answer] = []
        self._url, self._image, self._expected = url, image, expected
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="modelmesh-caller")

    def __enter__(self) -> Caller:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(DEADLINE + 5)

    def _run(self) -> None:
        with grpcclient.InferenceServerClient(self._url) as client:
            while not self._stop.is_set():
                began = time.monotonic()
                tensor = grpcclient.InferInput(INPUT, list(self._image.shape), "FP32")
                tensor.set_data_from_numpy(self._image)
                try:
                    result = client.infer(NAME, [tensor], client_timeout=DEADLINE)
                    got = np.asarray(result.as_numpy(OUTPUT))
                    version = next(
                        (v for v, e in self._expected.items() if np.allclose(got, e, 1e-5, 1e-6)),
                        "",
                    )
                    self.answers.append(Answer(began, version, "" if version else str(got)))
                except InferenceServerException as e:
                    said = f"{e.status()}: {str(e.message())[:200]}"
                    self.answers.append(Answer(began, "", said))
                self._stop.wait(0.05)

    def since(self, moment: float) -> list[Answer]:
        return [a for a in list(self.answers) if a.start >= moment]


def _model_status(custom: Any) -> dict[str, Any]:
    obj = custom.get_namespaced_custom_object(KSERVE, "v1beta1", NAMESPACE, ISVCS, NAME)
    return dict((obj.get("status") or {}).get("modelStatus") or {})


def _move_to(custom: Any, path: str) -> float:
    """Patch the InferenceService's storage path; returns when."""
    moment = time.monotonic()
    custom.patch_namespaced_custom_object(
        KSERVE, "v1beta1", NAMESPACE, ISVCS, NAME,
        {"spec": {"predictor": {"model": {"storage": {"path": path}}}}},
    )  # fmt: skip
    return moment


@pytest.mark.slow
@pytest.mark.triton
def test_a_spec_change_never_leaves_the_name_unanswered(cluster: SimCluster, s3: S3) -> None:
    assert cluster.kube is not None
    core = cast(Any, kubernetes.client.CoreV1Api(cluster.kube))
    custom = cast(Any, kubernetes.client.CustomObjectsApi(cluster.kube))
    files = {"v1": _mnist(7), "v2": _mnist(8)}
    s3.put(BUCKET, "onnx/mnist.onnx", files["v1"])
    s3.put(BUCKET, "onnx/mnist-v2.onnx", files["v2"])
    s3.put(BUCKET, "onnx/mnist-broken.onnx", b"not an ONNX model")
    onnx_e2e.set_up_namespace(core, custom, s3)
    custom.create_namespaced_custom_object(
        KSERVE, "v1beta1", NAMESPACE, ISVCS, onnx_e2e._isvc(NAME)
    )
    said = partial(onnx_e2e._said, custom, NAME)
    wait_until(
        f"{NAME} Loaded",
        partial(onnx_e2e._loaded, custom, NAME),
        150,
        on_fail=lambda: said() + cluster.log_tails(),
    )
    image = np.random.default_rng(1).random((1, 1, 28, 28), dtype=np.float32)
    expected = {
        version: np.asarray(
            onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"]).run(
                [OUTPUT], {INPUT: image}
            )[0]
        )
        for version, data in files.items()
    }
    services = ServiceProxy(cluster.kube, period=0.2)
    services.start()
    try:
        address = wait_until(
            "the modelmesh-serving Service",
            lambda: core.read_namespaced_service("modelmesh-serving", NAMESPACE).spec.cluster_ip,
            30,
        )
        wait_until(
            "its gRPC port listening", lambda: onnx_e2e._listening(address, 8033), 30
        )  # fmt: skip
        url = f"{address}:8033"

        def first_answer() -> bool:
            try:
                onnx_e2e._infer(url, NAME, image)
            except InferenceServerException:
                return False  # the host has not read its routes yet
            return True

        wait_until(f"{NAME} routed", first_answer, 60)
        with Caller(url, image, expected) as caller:
            wait_until("the caller's first answer", lambda: caller.answers, 30)
            # New files: the old ones answer until the new ones are loaded, then the new ones.
            moved = _move_to(custom, "onnx/mnist-v2.onnx")
            wait_until(
                "v2 Loaded and up to date",
                lambda: _model_status(custom).get("transitionStatus") == "UpToDate"
                and onnx_e2e._loaded(custom, NAME)
                and (custom.get_namespaced_custom_object(
                    "tritonshare.io", "v1alpha1", NAMESPACE, "tritonmodels", NAME
                ).get("status") or {}).get("loadedStorageUri", "").endswith("mnist-v2.onnx"),
                150,
                on_fail=lambda: said() + cluster.log_tails(),
            )  # fmt: skip
            wait_until("v2 answering", lambda: caller.answers[-1].version == "v2", 30)
            during = caller.since(moved)
            failed = [a for a in during if not a.version]
            assert not failed, failed[:5]
            assert [a.version for a in during][-1] == "v2"

            # Files Triton cannot load: the last good ones keep answering, and it says so.
            broken = _move_to(custom, "onnx/mnist-broken.onnx")
            status = wait_until(
                "BlockedByFailedLoad",
                lambda: (ms := _model_status(custom)).get("transitionStatus")
                == "BlockedByFailedLoad" and ms,
                150,
                on_fail=lambda: said() + cluster.log_tails(),
            )  # fmt: skip
            assert status["states"] == {
                "activeModelState": "Loaded",
                "targetModelState": "FailedToLoad",
            }, status
            assert status["lastFailureInfo"]["reason"] == "ModelLoadFailed", status
            seen = len(caller.since(broken))
            wait_until("ten answers more", lambda: len(caller.since(broken)) >= seen + 10, 30)
            after = caller.since(broken)
            assert {a.version for a in after} == {"v2"}, [a for a in after if a.version != "v2"][:5]
    finally:
        services.stop()
    assert len(caller.answers) > 20, len(caller.answers)
