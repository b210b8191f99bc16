"""Services' Endpoints and EndpointSlices, kept by the simulated controller manager from the pods
each Service selects, read through the official client (CoreV1Api, DiscoveryV1Api) and kubectl:
ready pods in `addresses` / `conditions.ready`, the others in `notReadyAddresses` / not ready, a
pod being deleted out of the Endpoints and `terminating` in its slice, named target ports resolved
per pod, and both gone with their Service."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import kubernetes.client

from sim.apiserver import RunningApiServer
from sim.controllers.manager import ControllerManager
from sim.processes import wait_until
from tests.conftest import require_executable
from tests.fixtures_sim import core_v1

NS = "default"


def until(what: str, check: Any) -> None:
    wait_until(what, check, 10)


def add_pod(core: Any, name: str, app: str, ip: str, *, ready: bool) -> None:
    core.create_namespaced_pod(
        NS,
        {
            "metadata": {"name": name, "labels": {"app": app}},
            "spec": {
                "nodeName": "n1",
                "containers": [
                    {"name": "c", "image": "x", "ports": [{"name": "http", "containerPort": 8080}]}
                ],
            },
        },
    )
    set_ready(core, name, ip, ready)


def set_ready(core: Any, name: str, ip: str, ready: bool) -> None:
    status = {
        "phase": "Running",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    core.patch_namespaced_pod_status(name, NS, {"status": status})


def endpoints_of(core: Any) -> tuple[list[str], list[str], list[int]] | None:
    """(ready ips, not-ready ips, ports) of Service web's Endpoints, or None."""
    try:
        found = core.read_namespaced_endpoints("web", NS)
    except kubernetes.client.ApiException:
        return None
    ready: list[str] = []
    not_ready: list[str] = []
    ports: list[int] = []
    for subset in found.subsets or []:
        ready += [a.ip for a in subset.addresses or []]
        not_ready += [a.ip for a in subset.not_ready_addresses or []]
        ports += [p.port for p in subset.ports or []]
    return sorted(ready), sorted(not_ready), ports


def slices_of(discovery: Any) -> list[Any]:
    return list(
        discovery.list_namespaced_endpoint_slice(
            NS, label_selector="kubernetes.io/service-name=web"
        ).items
    )


def slice_endpoints(discovery: Any) -> dict[str, tuple[bool, bool, bool]]:
    """ip -> (ready, serving, terminating) over Service web's slices."""
    return {
        e.addresses[0]: (e.conditions.ready, e.conditions.serving, e.conditions.terminating)
        for s in slices_of(discovery)
        for e in s.endpoints or []
    }


def test_a_services_endpoints_and_slices_follow_its_pods(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    manager: ControllerManager,
    tmp_path: Path,
) -> None:
    core = core_v1(kube_api)
    discovery: Any = kubernetes.client.DiscoveryV1Api(kube_api)
    add_pod(core, "web-1", "web", "127.1.9.1", ready=True)
    add_pod(core, "web-2", "web", "127.1.9.2", ready=False)
    add_pod(core, "other", "other", "127.1.9.3", ready=True)
    core.create_namespaced_service(
        NS,
        {
            "metadata": {"name": "web", "labels": {"tier": "front"}},
            "spec": {
                "selector": {"app": "web"},
                "ports": [{"name": "http", "port": 80, "targetPort": "http"}],
            },
        },
    )
    wanted = (["127.1.9.1"], ["127.1.9.2"], [8080])
    until("the first endpoints", lambda: endpoints_of(core) == wanted)
    until("the slice", lambda: len(slice_endpoints(discovery)) == 2)
    [piece] = slices_of(discovery)
    assert piece.address_type == "IPv4"
    assert [(p.name, p.port, p.protocol) for p in piece.ports] == [("http", 8080, "TCP")]
    assert piece.metadata.labels["tier"] == "front"
    assert [(o.kind, o.name, o.controller) for o in piece.metadata.owner_references] == [
        ("Service", "web", True)
    ]
    assert slice_endpoints(discovery) == {
        "127.1.9.1": (True, True, False),
        "127.1.9.2": (False, False, False),
    }
    assert {e.target_ref.name for e in piece.endpoints} == {"web-1", "web-2"}

    # kubectl reads both, as on a real cluster.
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    result = subprocess.run(
        [require_executable("kubectl"), "get", "endpoints,endpointslices", "-n", NS],
        env=dict(os.environ, KUBECONFIG=str(kubeconfig)),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (result.returncode, result.stderr) == (0, "")
    rows = [line.split() for line in result.stdout.splitlines()]
    assert rows[1][:2] == ["endpoints/web", "127.1.9.1:8080"], result.stdout
    assert ["NAME", "ADDRESSTYPE", "PORTS", "ENDPOINTS", "AGE"] in rows, result.stdout
    assert any(r[1:4] == ["IPv4", "8080", "127.1.9.1,127.1.9.2"] for r in rows), result.stdout

    # Ready now: it joins; deleted with a grace: out of the Endpoints, terminating in its slice.
    set_ready(core, "web-2", "127.1.9.2", True)
    both: tuple[list[str], list[str], list[int]] = (["127.1.9.1", "127.1.9.2"], [], [8080])
    until("web-2 ready", lambda: endpoints_of(core) == both)
    core.delete_namespaced_pod("web-1", NS, grace_period_seconds=30)
    until("web-1 out", lambda: endpoints_of(core) == (["127.1.9.2"], [], [8080]))
    terminating = {"127.1.9.1": (False, True, True), "127.1.9.2": (True, True, False)}
    until("web-1 terminating", lambda: slice_endpoints(discovery) == terminating)

    # Relabelled out of the selector: gone from both.
    core.patch_namespaced_pod("web-2", NS, {"metadata": {"labels": {"app": "elsewhere"}}})
    until("web-2 out", lambda: endpoints_of(core) == ([], [], []))

    core.delete_namespaced_service("web", NS, _preload_content=False)
    until("both gone", lambda: endpoints_of(core) is None and not slices_of(discovery))


def test_a_service_without_a_selector_keeps_the_users_endpoints(
    kube_api: kubernetes.client.ApiClient, manager: ControllerManager
) -> None:
    core = core_v1(kube_api)
    core.create_namespaced_service(
        NS, {"metadata": {"name": "web"}, "spec": {"ports": [{"port": 80}]}}
    )
    core.create_namespaced_endpoints(
        NS,
        {
            "metadata": {"name": "web"},
            "subsets": [{"addresses": [{"ip": "10.9.9.9"}], "ports": [{"port": 80}]}],
        },
    )
    add_pod(core, "web-1", "web", "127.1.9.1", ready=True)
    core.create_namespaced_service(
        NS,
        {
            "metadata": {"name": "probe"},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 81}]},
        },
    )
    found = lambda: core.read_namespaced_endpoints("probe", NS)  # noqa: E731
    until("probe's own Endpoints", lambda: _exists(found))
    assert endpoints_of(core) == (["10.9.9.9"], [], [80])


def _exists(read: Any) -> bool:
    try:
        read()
    except kubernetes.client.ApiException:
        return False
    return True
