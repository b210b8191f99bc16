"""A TritonModel's status never reads Ready while a request would fail: at zero replicas, Ready is
True only once a replica of its current files has been ready; files that failed to load keep their
failure (Loaded False, and Ready's reason) at zero; new files make it Unknown again until they
load. Against the simulated API server, the agent's loaded condition written on the host as the
agent writes it."""

from __future__ import annotations

from typing import Any

from sim.apiserver import RunningApiServer
from tests.binder.simcluster import MakeBinder, eventually
from tests.binder.tritonmodels import test_model_hosts
from tests.binder.tritonmodels.test_model_hosts import nodes, scale, set_loaded, status
from tests.binder.tritonmodels.test_tritonmodels import GROUP, PLURAL, VERSION, hosts, model

apiserver = test_model_hosts.apiserver
custom = test_model_hosts.custom
__all__ = ["apiserver", "custom", "nodes"]


def conditions(custom: Any) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status(custom).get("conditions") or []}


def said(custom: Any, kind: str) -> tuple[str, str]:
    found = conditions(custom).get(kind) or {}
    return str(found.get("status")), str(found.get("reason"))


async def test_a_model_whose_files_never_loaded_is_not_ready_at_zero(
    nodes: tuple[str, ...],
    custom: Any,
    core: Any,
    make_binder: MakeBinder,
    apiserver: RunningApiServer,
) -> None:
    await make_binder()
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, model("resnet", 0))
    # Nothing placed, nothing ever loaded: 0 of 0 replicas ready is no answer to a request.
    await eventually(lambda: said(custom, "Loaded")[0] == "Unknown", what="Loaded Unknown")
    assert said(custom, "Ready") == ("Unknown", "NotLoadedYet")

    # One replica whose files cannot be fetched: Ready False FetchFailed, and kept at zero.
    scale(custom, 1)
    node = (await eventually(lambda: list(hosts(core)), what="the host"))[0]
    not_found = "https://models.example.com/x.tar.gz answered HTTP 404 Not Found"
    set_loaded(core, node, "False", "FetchFailed", not_found)
    await eventually(lambda: said(custom, "Loaded") == ("False", "FetchFailed"), what="failed")
    assert said(custom, "Ready") == ("False", "FetchFailed")
    assert status(custom)["failedStorageUri"] == model("resnet", 0)["spec"]["storageUri"]
    scale(custom, 0)
    await eventually(lambda: not status(custom).get("replicas"), what="no replica")
    assert said(custom, "Ready") == ("False", "FetchFailed"), conditions(custom)
    assert not_found in conditions(custom)["Ready"]["message"]


async def test_a_model_ready_once_reads_ready_at_zero_until_its_files_change(
    nodes: tuple[str, ...],
    custom: Any,
    core: Any,
    make_binder: MakeBinder,
    apiserver: RunningApiServer,
) -> None:
    await make_binder()
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, model("resnet", 1))
    node = (await eventually(lambda: list(hosts(core)), what="the host"))[0]
    set_loaded(core, node, "True")
    await eventually(lambda: said(custom, "Ready") == ("True", "AllReplicasReady"), what="ready")
    assert said(custom, "Loaded") == ("True", "FilesLoaded")
    uri = model("resnet", 1)["spec"]["storageUri"]
    assert status(custom)["loadedStorageUri"] == uri
    scale(custom, 0)
    await eventually(lambda: not status(custom).get("replicas"), what="no replica")
    await eventually(lambda: "0 of 0" in conditions(custom)["Ready"]["message"], what="0 of 0")
    # Loaded once: a request at zero is answered (the model wakes on it).
    assert said(custom, "Ready") == ("True", "AllReplicasReady")
    # New files, never loaded: not Ready until a replica of them has been.
    custom.patch_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, "resnet", {"spec": {"storageUri": uri + ".new"}}
    )
    await eventually(lambda: said(custom, "Ready") == ("Unknown", "NotLoadedYet"), what="new")
    assert said(custom, "Loaded") == ("Unknown", "NotLoadedYet")
