"""KServe's Python SDK, where installed (`pip install kserve`: not a test dependency, skipped
without it), against the binder and its InferenceService controller on the simulated API server
serving tritonshare's KServe CRDs: `KServeClient.create` of a `V1beta1InferenceService` in
ModelMesh's form, `get`, and `wait_isvc_ready` until the status tritonshare writes reads Ready,
as a user of ModelMesh scripts it. Checked with kserve 0.21.0 and kubernetes 35.0.0 (its create
fails under kubernetes 37's argument validation, whatever the server)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from binder.app import Binder
from common.contract import Keys
from common.hosted import loaded_condition
from tests.binder.inferenceservices import test_inferenceservices as isvcs
from tests.binder.simcluster import eventually

kserve: Any = pytest.importorskip("kserve")
client_models: Any = pytest.importorskip("kubernetes.client")

apiserver = isvcs.apiserver
binder = isvcs.binder
custom = isvcs.custom
NAME = "example-onnx-mnist"


async def test_kserve_client_creates_reads_and_waits_for_one(
    binder: Binder, custom: Any, core: Any, kubeconfig: Path
) -> None:
    sdk = kserve.KServeClient(config_file=str(kubeconfig))
    isvc = kserve.V1beta1InferenceService(
        api_version=kserve.constants.KSERVE_V1BETA1,
        kind=kserve.constants.KSERVE_KIND_INFERENCESERVICE,
        metadata=client_models.V1ObjectMeta(
            name=NAME, namespace=isvcs.NS, annotations=dict(isvcs.MODELMESH)
        ),
        spec=kserve.V1beta1InferenceServiceSpec(
            predictor=kserve.V1beta1PredictorSpec(
                model=kserve.V1beta1ModelSpec(
                    model_format=kserve.V1beta1ModelFormat(name="onnx"),
                    runtime="triton-2.x",
                    storage=kserve.models.V1beta1ModelStorageSpec(
                        key="localMinIO", path="onnx/mnist.onnx"
                    ),
                )
            )
        ),
    )
    created = await asyncio.to_thread(sdk.create, isvc)
    assert created["metadata"]["name"] == NAME
    read = await asyncio.to_thread(sdk.get, NAME, namespace=isvcs.NS)
    assert read["spec"]["predictor"]["model"]["storage"] == {
        "key": "localMinIO",
        "path": "onnx/mnist.onnx",
    }
    assert not await asyncio.to_thread(sdk.is_isvc_ready, NAME, namespace=isvcs.NS)

    waiting = asyncio.create_task(
        asyncio.to_thread(
            sdk.wait_isvc_ready, NAME, namespace=isvcs.NS, timeout_seconds=60, polling_interval=1
        )
    )
    # The node's agent and the host's loader, as the InferenceService tests stand for them.
    model = await eventually(lambda: isvcs.tritonmodel(custom, NAME), what="its TritonModel")
    assert model is not None

    def placed() -> dict[str, Any] | None:
        entries = ((isvcs.tritonmodel(custom, NAME) or {}).get("status") or {}).get("placements")
        return entries[0] if entries else None

    entry = await eventually(placed, what="its replica placed")
    await eventually(lambda: isvcs._has_host(core, entry["host"]), what="the host pod")
    try:
        isvcs.set_loaded(core, entry["host"], NAME)
    except client_models.exceptions.ApiTypeError:
        # A kubernetes client older than the project's (as KServe's SDK may pin) has no
        # `_content_type`: its default patch, a merge patch, sets the conditions as well.
        _set_loaded_by_merge(core, entry["host"])
    await asyncio.wait_for(waiting, 90)
    assert await asyncio.to_thread(sdk.is_isvc_ready, NAME, namespace=isvcs.NS)
    status = (await asyncio.to_thread(sdk.get, NAME, namespace=isvcs.NS))["status"]
    assert status["modelStatus"]["states"]["activeModelState"] == "Loaded"


def _set_loaded_by_merge(core: Any, host: str) -> None:
    """`isvcs.set_loaded` for a kubernetes client that cannot choose the patch's content type."""
    condition = loaded_condition(Keys(), NAME, 0)
    conditions = [
        {"type": condition, "status": "True", "reason": "ModelReady", "message": ""},
        {"type": "Ready", "status": "True"},
    ]
    core.patch_namespaced_pod_status(host, isvcs.NS, {"status": {"conditions": conditions}})
