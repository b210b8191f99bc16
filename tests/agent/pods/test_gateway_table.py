"""The caller table the agent writes for the node gateway: through the real agent, its pod watch
on the simulated API server and a real Triton; and `callers_of`'s rules on their own.

A caller is a proven pod of this node that owns its model here and has an address of its own. A
pod created with spec.nodeName (no proof), a pod asking for a model another pod owns, a pod on the
host network, and an address two pods claim are never callers; a deleted pod leaves the table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes.client
import pytest

from agent.pods.callertable import CallerPublisher, callers_of, nobody_quarantined
from agent.pods.modelpods import PodInfo, pod_from_dict
from agent.pods.provenpods import Proven
from common.callers import CallerTable, read_table
from common.contract import Keys
from sim.apiserver import RunningApiServer
from tests.agent.conftest import (
    NODE,
    RunningAgent,
    StartAgent,
    eventually,
    install_dir,
    make_pod,
)
from tests.conftest import copy_model

pytestmark = pytest.mark.triton


def pod(name: str, ip: str, *, host_ip: str = "10.0.0.1", host_network: bool = False) -> Proven:
    info = PodInfo(
        "team", name, f"uid-{name}", NODE, "tritonshare", "Running", name, "GPU-1",
        pod_ip=ip, host_ip=host_ip, host_network=host_network,
    )  # fmt: skip
    return Proven(info, 1024**3)


def test_callers_are_pods_with_an_address_of_their_own() -> None:
    owners = [
        pod("a", "10.1.0.5"),
        pod("host", "10.0.0.1", host_network=True),
        pod("same-as-node", "10.0.0.1"),
        pod("no-ip-yet", ""),
        pod("twin1", "10.1.0.9"),
        pod("twin2", "10.1.0.9"),
    ]
    callers, left_out = callers_of({f"{p.model_id}-private": p for p in owners})
    assert [(c.address, c.model_id, c.pod, c.triton_name) for c in callers] == [
        ("10.1.0.5", "a", "team/a", "a-private")
    ]
    assert any("team/host" in reason for reason in left_out)
    assert any("team/same-as-node" in reason for reason in left_out)
    assert any("10.1.0.9" in reason and "team/twin1" in reason for reason in left_out)


def replica(
    model: str, host: str, ip: str, namespace: str = "team", ordinal: int = 0, **fields: Any
) -> Proven:
    info = PodInfo(
        namespace, f"{model}/{ordinal}", f"uid-{model}/{ordinal}", NODE, "tritonshare", "Running",
        model, "GPU-1", pod_ip=ip, host_ip="10.0.0.1", host=host, host_uid=f"uid-{host}",
        **fields,
    )  # fmt: skip
    return Proven(info, 1024**3)


def test_a_hosts_several_replicas_of_a_model_are_reached_through_one_loaded_not_draining() -> None:
    """The gateway maps a host's model to one private name: a loaded one, not draining first,
    then the lowest ordinal; so a surge in place takes over once loaded, from a draining one
    at once."""
    host, ip = "tritonshare-host-1", "10.1.0.7"
    loaded = ("True", "ModelReady")

    def chosen(*owners: Proven) -> str:
        callers, left_out = callers_of({f"{p.pod.name}-private": p for p in owners})
        assert not left_out
        [row] = callers
        return row.triton_name

    old = replica("resnet", host, ip, ordinal=3, model_loaded=loaded)
    surge = replica("resnet", host, ip, ordinal=5)
    assert chosen(old, surge) == "resnet/3-private", "the surge still loading"
    surge = replica("resnet", host, ip, ordinal=5, model_loaded=loaded)
    assert chosen(old, surge) == "resnet/3-private"
    leaving = replica(
        "resnet", host, ip, ordinal=3, deleting=True, draining=True, model_loaded=loaded
    )
    assert chosen(leaving, surge) == "resnet/5-private", "the drained one at once"
    assert chosen(leaving, replica("resnet", host, ip, ordinal=5)) == "resnet/3-private", (
        "still the only one loaded"
    )


def test_a_hosts_row_spreads_over_its_loaded_not_draining_replicas_of_the_model() -> None:
    """The row is the preferred replica's, as above; when that one is loaded and not draining,
    it names every other such replica too, for the gateway to spread the model's requests."""
    host, ip = "tritonshare-host-1", "10.1.0.7"
    loaded = ("True", "ModelReady")

    def row(*owners: Proven) -> tuple[str, tuple[tuple[str, str], ...]]:
        callers, left_out = callers_of({f"{p.pod.name}-private": p for p in owners})
        assert not left_out
        [only] = callers
        return only.triton_name, only.spread

    first = replica("resnet", host, ip, ordinal=1, model_loaded=loaded)
    second = replica("resnet", host, ip, ordinal=2, model_loaded=loaded)
    loading = replica("resnet", host, ip, ordinal=3)
    draining = replica(
        "resnet", host, ip, ordinal=0, deleting=True, draining=True, model_loaded=loaded
    )
    assert row(loading, second, draining, first) == (
        "resnet/1-private",
        (("resnet/2-private", "uid-resnet/2"),),
    )
    assert row(first, second, replica("resnet", host, ip, ordinal=4, model_loaded=loaded))[1] == (
        ("resnet/2-private", "uid-resnet/2"),
        ("resnet/4-private", "uid-resnet/4"),
    )
    assert row(first, loading) == ("resnet/1-private", ()), "a loading one takes none yet"
    assert row(draining, loading) == ("resnet/0-private", ()), "none other loaded: as before"
    assert row(loading, replica("resnet", host, ip, ordinal=5)) == ("resnet/3-private", ())
    assert row(first) == ("resnet/1-private", ())


def test_a_held_rows_spread_is_held_too(tmp_path: Path) -> None:
    """The gateway holds a probationer's replicas each (its activity table names each): the
    agent waits for every one of them to drain."""
    host, ip, loaded = "tritonshare-host-1", "10.1.0.7", ("True", "ModelReady")
    owners = {
        f"resnet.{n}.private": replica("resnet", host, ip, ordinal=n, model_loaded=loaded)
        for n in (1, 2)
    }
    publisher = CallerPublisher(
        tmp_path / "callers.json",
        NODE,
        lambda: owners,
        quarantine=nobody_quarantined,
        probation=bool,
        held=lambda pod, probation: probation,
        trial=lambda: False,  # no hold is a trial
        key_of=lambda uid: "",  # no caller keys: pods known by address
    )
    publisher.publish()
    assert publisher.held_names() == ["resnet.1.private", "resnet.2.private"]
    [row] = read_table(tmp_path / "callers.json").callers
    assert row.held and row.spread == (("resnet.2.private", "uid-resnet/2"),)


def test_a_hosts_replicas_are_one_row_each_at_its_address() -> None:
    """A model host is a caller per replica, all at its address; an address a host shares
    with another pod, or another host, stays refused."""
    owners = [
        replica("resnet", "tritonshare-host-1", "10.1.0.7"),
        replica("bert", "tritonshare-host-1", "10.1.0.7"),
        replica("vgg", "tritonshare-host-1", "10.1.0.8", namespace="other"),
        pod("squatter", "10.1.0.8"),
    ]
    callers, left_out = callers_of({f"{p.model_id}-private": p for p in owners})
    assert [(c.address, c.model_id, c.pod, c.uid, c.triton_name) for c in callers] == [
        ("10.1.0.7", "bert", "team/tritonshare-host-1", "uid-bert/0", "bert-private"),
        ("10.1.0.7", "resnet", "team/tritonshare-host-1", "uid-resnet/0", "resnet-private"),
    ]
    assert any("10.1.0.8" in r and "other/tritonshare-host-1" in r for r in left_out)


@pytest.mark.parametrize(
    ("container", "declared"),
    [
        ({"name": "proxy", "args": ["--model-id=m", "--container-concurrency=4"]}, 4),
        ({"name": "proxy",
          "command": ["python", "-m", "proxy", "--container-concurrency", "8"]}, 8),
        ({"name": "proxy",
          "env": [{"name": "TRITONSHARE_CONTAINER_CONCURRENCY", "value": "3"}]}, 3),
        (
            {"name": "proxy", "args": ["--container-concurrency=2"],
             "env": [{"name": "TRITONSHARE_CONTAINER_CONCURRENCY", "value": "9"}]},
            2,
        ),
        ({"name": "proxy", "args": ["--container-concurrency=many"]}, 0),
        ({"name": "proxy", "args": ["--model-id=m"]}, 0),
    ],
)  # fmt: skip
def test_the_proxys_declared_concurrency_reaches_the_caller_table(
    container: dict[str, Any], declared: int
) -> None:
    """The flag wins over its variable, as in the proxy; what is not a whole number declares
    nothing (the gateway's default applies)."""
    document = {
        "metadata": {"namespace": "team", "name": "a", "uid": "uid-a",
                     "annotations": {"tritonshare.io/model-id": "a"}},
        "spec": {"nodeName": NODE, "containers": [container]},
        "status": {"phase": "Running", "podIP": "10.1.0.5", "hostIP": "10.0.0.1"},
    }  # fmt: skip
    info = pod_from_dict(document, Keys())
    assert info.concurrency == declared
    callers, _ = callers_of({"a": Proven(info, 1024**3)})
    assert [c.triton_name for c in callers] == [""]  # a legacy model: served by its public id
    assert [c.concurrency for c in callers] == [declared]


def set_address(api: kubernetes.client.ApiClient, name: str, ip: str) -> None:
    """What the kubelet writes once the pod's sandbox has its address."""
    core: Any = kubernetes.client.CoreV1Api(api)
    core.patch_namespaced_pod_status(
        name, "default", {"status": {"podIP": ip, "podIPs": [{"ip": ip}], "hostIP": "127.0.0.1"}}
    )


def table_of(path: Path) -> CallerTable | None:
    try:
        return read_table(path)
    except ValueError:
        return None


def addresses(path: Path) -> dict[str, str]:
    table = table_of(path)
    return {} if table is None else {c.address: c.model_id for c in table.callers}


async def test_the_agent_writes_its_proven_owners_and_drops_a_deleted_pod(
    start_custom_agent: StartAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    tmp_path: Path,
) -> None:
    table = tmp_path / "gateway" / "callers.json"
    running: RunningAgent = await start_custom_agent(
        gateway_table=table, gateway_table_refresh_seconds=0.2
    )
    await eventually(lambda: table_of(table) is not None, what="the first caller table")
    first = table_of(table)
    assert first is not None and first.node == NODE and first.callers == ()

    gpu = running.mock.gpus[0].uuid
    make_pod(kube_api, "owner", "add_one", gpu_uuid=gpu)
    set_address(kube_api, "owner", "127.1.0.5")
    # Proven but owning nothing yet: no caller until its loader installs the model.
    await eventually(lambda: running.agent.pods.by_key.get("default/owner") is not None)
    assert addresses(table) == {}
    token = apiserver.mint_token("default", "owner")
    await install_dir(running.stub, token, copy_model("add_one", tmp_path / "m"), "add_one")
    await eventually(
        lambda: addresses(table) == {"127.1.0.5": "add_one"}, what="the owner in the table"
    )

    # A pod created with spec.nodeName and no proof, and a proven pod asking for the model
    # another pod owns: neither becomes a caller.
    make_pod(kube_api, "squatter", "add_one", gpu_uuid=gpu, proven=False)
    set_address(kube_api, "squatter", "127.1.0.6")
    make_pod(kube_api, "copycat", "add_one", gpu_uuid=gpu)
    set_address(kube_api, "copycat", "127.1.0.7")
    await eventually(lambda: running.agent.pods.by_key.get("default/copycat") is not None)
    assert addresses(table) == {"127.1.0.5": "add_one"}

    # The table is rewritten while nothing changes: the gateway can tell the agent is alive.
    before = table_of(table)
    assert before is not None
    await eventually(
        lambda: (t := table_of(table)) is not None and t.written_at > before.written_at,
        what="a refresh of the table",
    )

    core: Any = kubernetes.client.CoreV1Api(kube_api)
    core.delete_namespaced_pod("owner", "default", grace_period_seconds=0)
    await eventually(lambda: addresses(table) == {}, what="the deleted owner leaving the table")


async def test_without_a_table_path_there_is_no_publisher(start_custom_agent: StartAgent) -> None:
    running = await start_custom_agent()
    assert running.agent.callers is None
    assert running.agent.reconciler.on_pods is None
