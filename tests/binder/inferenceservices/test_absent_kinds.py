"""Without KServe's CRDs the InferenceService controller stays idle: the binder starts, is
ready, and asks for the kinds again later; CRDs applied then (KServe installed, or tritonshare's
deploy/kserve-crds) are found without a restart and their InferenceServices served; turned off,
it does not ask at all."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any, cast

import kubernetes.client
import pytest
import yaml

from binder.api import informer
from sim.apiserver import RunningApiServer
from tests.binder.inferenceservices import test_inferenceservices as isvcs
from tests.binder.objects import GI
from tests.binder.simcluster import MakeBinder, add_node, eventually
from tests.deploy.rendering import CHART, DEPLOY

KINDS = {"inferenceservices", "servingruntimes", "clusterservingruntimes"}


async def test_without_the_crds_the_binder_is_ready_and_the_controller_idle(
    kube_api: kubernetes.client.ApiClient, make_binder: MakeBinder, apiserver: RunningApiServer
) -> None:
    add_node(kube_api, "n1", [16 * GI])
    binder = await make_binder()
    assert binder.not_ready() == []
    absent = {i.kind for i in binder._informers if i.absent}
    assert absent >= KINDS
    asked = {r.resource for r in apiserver.audit if r.user_agent.startswith("tritonshare-binder/")}
    assert asked >= KINDS, "each kind was asked for (404) before the binder was ready"
    await eventually(lambda: binder.role() == "leader", what="scheduling")


async def test_turned_off_it_asks_for_none_of_the_kinds(
    kube_api: kubernetes.client.ApiClient, make_binder: MakeBinder, apiserver: RunningApiServer
) -> None:
    binder = await make_binder(inferenceservices=False)
    assert binder.inferenceservices is None
    assert binder.not_ready() == []
    asked = {r.resource for r in apiserver.audit if r.user_agent.startswith("tritonshare-binder/")}
    assert not KINDS & asked


def _crds(*files: Path) -> list[dict[str, Any]]:
    return [d for f in files for d in yaml.safe_load_all(f.read_text()) if d]


async def test_crds_applied_later_are_found_and_their_inferenceservices_served(
    kube_api: kubernetes.client.ApiClient,
    core: Any,
    make_binder: MakeBinder,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(informer, "RETRY_MAX_SECONDS", 0.5)  # asked again every 30 s
    add_node(kube_api, "n1", [16 * GI])
    binder = await make_binder()
    assert {i.kind for i in binder._informers if i.absent} >= KINDS
    extensions = cast(Any, kubernetes.client.ApiextensionsV1Api(kube_api))
    for crd in _crds(
        *sorted((CHART / "crds").glob("*.yaml")), DEPLOY / "kserve-crds" / "kserve-crds.yaml"
    ):
        extensions.create_custom_resource_definition(crd)
    await eventually(
        lambda: not {i.kind for i in binder._informers if i.absent} & KINDS,
        what="the kinds found",
    )
    custom = cast(Any, kubernetes.client.CustomObjectsApi(kube_api))
    isvcs.namespace(core, isvcs.NS)
    custom.create_namespaced_custom_object(
        isvcs.KSERVE, "v1alpha1", isvcs.NS, "servingruntimes", isvcs.TRITON_2X
    )
    data = {k: base64.b64encode(v.encode()).decode() for k, v in isvcs.STORAGE_CONFIG.items()}
    core.create_namespaced_secret(isvcs.NS, {"metadata": {"name": "storage-config"}, "data": data})
    isvcs.create(custom, isvcs.isvc("example-onnx-mnist", isvcs.MNIST))
    model = await eventually(
        lambda: isvcs.tritonmodel(custom, "example-onnx-mnist"), what="its TritonModel"
    )
    assert model["spec"]["storageUri"] == "s3://modelmesh-example-models/onnx/mnist.onnx"
