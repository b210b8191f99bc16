"""The binder's built-in autoscaler loop (binder/autoscaler/loop.py) against the simulated API
server serving the chart's CRD: it reads a host's /autoscaling counts (served here by a stand-in on
the host pod's address) each second and scales the TritonModel through `scale` with an Event; an HPA
or a KEDA ScaledObject's HPA on the model turns it off with the condition saying which; settings
it cannot act on are a condition too; every call it makes is one deploy/'s RBAC grants. A
Deployment with Knative's annotations is scaled on its model pods' counts, and told in Events."""

from __future__ import annotations

import asyncio
import ipaddress
import itertools
import json
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, cast

import aiohttp
import kubernetes.client
import pytest
from aiohttp import web

from binder.app import Binder
from binder.autoscaler.loadcounts import answer_bound
from binder.autoscaler.loop import read_counts
from binder.autoscaler.parkedmodels import parked_on
from binder.autoscaler.room import ROOM_SECONDS
from common.contract import DEFAULT_PROXY_METRICS_PORT, PROXY_AUTOSCALING_PATH, Keys
from common.hosted import host_name
from sim.apiserver import ApiServerSettings, RunningApiServer, start_in_thread
from sim.claims import claim, ports_free
from tests.binder.objects import GI, pod_obj
from tests.binder.simcluster import MakeBinder, add_node, add_pod, eventually, node_of
from tests.binder.tritonmodels.test_host_gaps import loaded as agent_loaded
from tests.binder.tritonmodels.test_model_hosts import HOST_READY
from tests.binder.tritonmodels.test_tritonmodels import SERVES, hosts, loaded_types
from tests.conftest import require_executable
from tests.deploy.rendering import CHART, render
from tests.e2e.test_rbac import describe, grants_for
from tests.fixtures_sim import apps_v1

GROUP, VERSION, PLURAL = "tritonshare.io", "v1alpha1", "tritonmodels"
KEYS = Keys()
ADDRESSES = ipaddress.IPv4Network("127.3.0.0/16")
"""Where the stand-ins for proxies' metrics ports listen (each a pod's address): one no other
process of the machine holds (`sim.claims`), so runs side by side never meet."""


class Counts:
    """A host proxy's /autoscaling for model `resnet`: `concurrency` requests held, integrated
    over real time."""

    def __init__(self, address: str) -> None:
        self.address = address
        """The host pod's address, where the stand-in for its proxy's metrics port listens."""
        self.concurrency = 0.0
        self._held = 0.0
        self._at = time.monotonic()
        self.reads = 0

    def read(self) -> dict[str, list[float]]:
        now = time.monotonic()
        self._held += self.concurrency * (now - self._at)
        self._at = now
        self.reads += 1
        return {"resnet": [self._held, 0]}


@pytest.fixture
def apiserver() -> Iterator[RunningApiServer]:
    """The simulated API server serving the chart's CRDs (overrides tests.fixtures_sim's)."""
    server = start_in_thread(settings=ApiServerSettings(crds=(CHART / "crds",)))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def custom(kube_api: kubernetes.client.ApiClient) -> Any:
    return kubernetes.client.CustomObjectsApi(kube_api)


@pytest.fixture
def address() -> Iterator[Callable[[], str]]:
    """Takes a free address of ADDRESSES, held until the test ends."""
    held: list[int] = []

    def take() -> str:
        for host in ADDRESSES.hosts():
            candidate = str(host)
            descriptor = claim(candidate)
            if descriptor is None:
                continue
            if ports_free(candidate, [DEFAULT_PROXY_METRICS_PORT]):
                held.append(descriptor)
                return candidate
            os.close(descriptor)
        raise AssertionError(f"every address of {ADDRESSES} is taken")

    try:
        yield take
    finally:
        for descriptor in held:
            os.close(descriptor)


@pytest.fixture
async def counts(address: Callable[[], str]) -> AsyncIterator[Counts]:
    served = Counts(address())

    async def answer(request: web.Request) -> web.Response:
        return web.json_response(served.read())

    app = web.Application()
    app.router.add_get(PROXY_AUTOSCALING_PATH, answer)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, served.address, DEFAULT_PROXY_METRICS_PORT).start()
    try:
        yield served
    finally:
        await runner.cleanup()


@pytest.fixture
async def binder(kube_api: kubernetes.client.ApiClient, make_binder: MakeBinder) -> Binder:
    for node in ("n1", "n2", "n3"):
        add_node(kube_api, node, [16 * GI])
    return await make_binder()


def model(name: str, replicas: int, autoscaling: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TritonModel",
        "metadata": {"name": name},
        "spec": {
            "storageUri": "https://models.example.com/x.tar.gz",
            "gpuMemory": "2Gi",
            "replicas": replicas,
            "autoscaling": autoscaling,
        },
    }


def hpa(name: str, target: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "scaleTargetRef": {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TritonModel"}
            | {"name": target},
            "minReplicas": 1,
            "maxReplicas": 3,
        },
    }


def read(custom: Any, name: str) -> dict[str, Any]:
    found: dict[str, Any] = custom.get_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, name
    )
    return found


def condition(custom: Any, name: str) -> dict[str, Any]:
    conditions = (read(custom, name).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "Autoscaling"), {})


def replicas(custom: Any, name: str) -> int:
    return int(read(custom, name)["spec"]["replicas"])


async def test_it_scales_on_the_hosts_counts_and_yields_to_an_hpa_or_keda(
    binder: Binder,
    custom: Any,
    core: Any,
    counts: Counts,
    apiserver: RunningApiServer,
) -> None:
    custom.create_namespaced_custom_object(
        GROUP,
        VERSION,
        "default",
        PLURAL,
        model("resnet", 1, {"target": 1, "maxReplicas": 3, "window": "6s"}),
    )
    selector = "tritonshare.io/model-host=true"

    def host() -> Any:
        pods = core.list_namespaced_pod("default", label_selector=selector).items
        return pods[0] if pods else None

    pod = await eventually(host, what="the model's host")
    core.patch_namespaced_pod_status(
        pod.metadata.name, "default", {"status": {"podIP": counts.address, "phase": "Running"}}
    )
    on = await eventually(lambda: condition(custom, "resnet").get("status") == "True")
    assert (
        "concurrency, target 1 per replica at 70 %, 1 to 3 replicas"
        in (condition(custom, "resnet")["message"])
    )
    assert on
    await eventually(lambda: counts.reads >= 2, what="the host's counts read")
    assert replicas(custom, "resnet") == 1  # idle

    counts.concurrency = 3.0  # 3 / 0.7 -> 5, at most 3
    await eventually(lambda: replicas(custom, "resnet") == 3, what="scaled to 3")
    counts.concurrency = 0.0
    # Out of panic a 6 s window after the last surge, then the stable window empties.
    await eventually(lambda: replicas(custom, "resnet") == 1, within=40, what="back to 1")

    def rescales() -> list[str]:
        events = core.list_namespaced_event("default", field_selector="involvedObject.name=resnet")
        return [e.message for e in events.items if e.reason == "SuccessfulRescale"]

    # The scale is written first, its Event after it: wait for the Event rather than race it.
    await eventually(
        lambda: any(m.startswith("New size: 1;") for m in rescales()), what="the Event of 1"
    )
    assert any(m.startswith("New size: 3; reason: concurrency") for m in rescales()), rescales()

    # An HPA on the model: the built-in autoscaler stays off, whatever the load.
    custom.create_namespaced_custom_object(
        "autoscaling", "v2", "default", "horizontalpodautoscalers", hpa("resnet-hpa", "resnet")
    )
    off = await eventually(
        lambda: (
            condition(custom, "resnet").get("reason") == "HorizontalPodAutoscaler"
            and condition(custom, "resnet")
        )
    )
    assert off["status"] == "False"
    assert off["message"].startswith("HorizontalPodAutoscaler resnet-hpa scales it")
    counts.concurrency = 3.0
    # A load that scaled it within seconds above, for three of its decisions: it stays.
    await asyncio.sleep(3)
    assert replicas(custom, "resnet") == 1
    custom.delete_namespaced_custom_object(
        "autoscaling", "v2", "default", "horizontalpodautoscalers", "resnet-hpa"
    )
    counts.concurrency = 0.0

    # KEDA's HPA for its ScaledObject says so.
    keda = hpa("keda-hpa-resnet", "resnet", {"scaledobject.keda.sh/name": "resnet"})
    custom.create_namespaced_custom_object(
        "autoscaling", "v2", "default", "horizontalpodautoscalers", keda
    )
    await eventually(lambda: condition(custom, "resnet").get("reason") == "KEDAScaledObject")
    assert condition(custom, "resnet")["message"].startswith("KEDA ScaledObject resnet scales it")

    # Settings it cannot act on.
    custom.create_namespaced_custom_object(
        GROUP,
        VERSION,
        "default",
        PLURAL,
        model("bert", 0, {"target": 1, "minReplicas": 3, "maxReplicas": 2}),
    )
    bad = await eventually(
        lambda: (
            condition(custom, "bert").get("reason") == "InvalidSettings"
            and condition(custom, "bert")
        )
    )
    assert "minReplicas (3) is above maxReplicas (2)" in bad["message"]
    assert replicas(custom, "bert") == 0

    # Every call the binder made here is one deploy/'s RBAC grants it.
    grants = grants_for("tritonshare-binder", render(require_executable("kubectl"), "base"))
    calls = [r for r in apiserver.audit if r.user_agent.startswith("tritonshare-binder/")]
    denied = sorted({describe(c) for c in calls if not any(g.allows(c) for g in grants)})
    assert not denied
    made = {(c.api_group, c.resource, c.subresource, c.verb) for c in calls}
    assert {
        ("tritonshare.io", "tritonmodels", "scale", "patch"),
        ("autoscaling", "horizontalpodautoscalers", "", "list"),
        ("autoscaling", "horizontalpodautoscalers", "", "watch"),
    } <= made


async def test_awake_first_admits_sleeping_replicas_while_the_awake_one_is_full_on_the_same_read(
    binder: Binder, custom: Any, core: Any, counts: Counts, address: Callable[[], str]
) -> None:
    """No spec.autoscaling: the hosts of an on-demand model with room for 1 a replica are read
    all the same, once a period, and the sleeping replica's label follows the awake one's room,
    leaving the Service again only after ROOM_SECONDS with room."""
    body = model("resnet", 2, {})
    del body["spec"]["autoscaling"]
    body["spec"] |= {"residency": "on-demand", "maxConcurrency": 1}
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)
    await eventually(lambda: len(hosts(core)) == 2, what="the model's two hosts")
    awake, asleep = sorted(hosts(core))
    for node, pod_ip, loaded in (
        (awake, counts.address, ("True", "ModelReady")),
        (asleep, address(), ("False", "ModelSleeping")),  # nothing answers there
    ):
        conditions = [
            {"type": t, "status": loaded[0], "reason": loaded[1]}
            for t in loaded_types(core, node, "resnet")
        ]
        status = {"podIP": pod_ip, "phase": "Running"}
        core.patch_namespaced_pod_status(
            host_name(node),
            "default",
            {"status": status | {"conditions": [*conditions, HOST_READY]}},
            _content_type="application/strategic-merge-patch+json",
        )

    def label() -> str | None:
        value: str | None = hosts(core)[asleep].metadata.labels.get(SERVES)
        return value

    await eventually(lambda: label() == "asleep", what="the sleeping one out")
    counts.concurrency = 0.9  # room
    await eventually(lambda: counts.reads >= 3, what="the awake host read")
    assert label() == "asleep"
    counts.concurrency = 2.0  # one in flight, one queued: full
    await eventually(lambda: label() == "true", what="the sleeping one in")
    reads, started = counts.reads, time.monotonic()
    counts.concurrency = 0.5
    await eventually(lambda: label() == "asleep", within=30, what="out again")
    took = time.monotonic() - started
    # Room since the read before at the earliest: at least ROOM_SECONDS less a period.
    assert took >= ROOM_SECONDS - 1.5, took
    assert counts.reads - reads <= took / binder.settings.autoscale_period_seconds + 2


KNATIVE = "autoscaling.knative.dev/"
DEEP = 10_000
"""Nesting of a poisoned answer: past any interpreter's recursion limit (the attack's 2,000 is
past a binder's 1,000, but this test process may run with more)."""
TEMPLATE_HASH = "5d9c7b6f4"


def deployment(
    name: str,
    *,
    target: str = "1",
    paused: bool = False,
    min_scale: str | None = None,
    residency: str | None = None,
) -> dict[str, Any]:
    """A Deployment with Knative's annotations whose pods are labelled app=`name` (with
    `residency`, its pod template says the pods' residency class)."""
    labels = {"app": name}
    annotations = {
        f"{KNATIVE}target": target,
        f"{KNATIVE}max-scale": "3",
        f"{KNATIVE}window": "6s",
    }
    if min_scale is not None:
        annotations[f"{KNATIVE}min-scale"] = min_scale
    template_meta: dict[str, Any] = {"labels": labels}
    if residency is not None:
        template_meta["annotations"] = {KEYS.residency: residency}
    return {
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "replicas": 1,
            "paused": paused,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": template_meta,
                "spec": {"containers": [{"name": "proxy", "image": "x"}]},
            },
        },
    }


async def own_pod(
    core: Any,
    namespace: str,
    owner: str,
    name: str,
    address: str,
    *,
    placed: bool = True,
    labels: dict[str, str] | None = None,
) -> None:
    """A running pod of Deployment `owner` (through its ReplicaSet, as the Deployment
    controller makes it) at `address`: a model pod placed by the binder, or (placed=False) one
    created on a node directly. No controller or kubelet runs here: the test creates the pod and
    writes its status."""
    obj = pod_obj(
        name,
        namespace=namespace,
        model=owner,
        node="" if placed else "n1",
        labels=(labels or {"app": owner}) | {"pod-template-hash": TEMPLATE_HASH},
    )
    del obj["metadata"]["uid"], obj["metadata"]["creationTimestamp"]
    obj["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "name": f"{owner}-{TEMPLATE_HASH}",
            "uid": f"rs-{namespace}-{owner}",
            "controller": True,
        }
    ]
    core.create_namespaced_pod(namespace, obj)
    await eventually(
        lambda: core.read_namespaced_pod(name, namespace).spec.node_name, what=f"{name} bound"
    )
    core.patch_namespaced_pod_status(
        name, namespace, {"status": {"podIP": address, "phase": "Running"}}
    )


def deployment_events(core: Any, namespace: str, name: str, reason: str) -> list[str]:
    found = core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.kind=Deployment,involvedObject.name={name}"
    ).items
    return [e.message for e in found if e.reason == reason]


async def test_a_deployment_with_knative_s_annotations_is_scaled_on_its_model_pods(
    binder: Binder, core: Any, kube_api: kubernetes.client.ApiClient, counts: Counts
) -> None:
    apps = apps_v1(kube_api)
    custom = cast(Any, kubernetes.client.CustomObjectsApi(kube_api))
    apps.create_namespaced_deployment("default", deployment("resnet"))
    # Its one model pod, placed by the binder, on the stand-in proxy's address; a pod of another
    # app there too, matching the selector but not the Deployment's own, which does not count.
    await own_pod(core, "default", "resnet", "resnet-0", counts.address)
    await own_pod(core, "default", "other", "other-0", counts.address, labels={"app": "resnet"})

    def events(reason: str) -> list[str]:
        return deployment_events(core, "default", "resnet", reason)

    await eventually(lambda: events("BuiltIn"), what="the BuiltIn Event")
    await eventually(lambda: counts.reads >= 2, what="the pod's counts read")
    counts.concurrency = 3.0
    await eventually(
        lambda: apps.read_namespaced_deployment("resnet", "default").spec.replicas == 3,
        what="scaled to 3",
    )
    await eventually(
        lambda: any(m.startswith("New size: 3;") for m in events("SuccessfulRescale")),
        what="the SuccessfulRescale Event (written after the scale)",
    )

    # KEDA's ScaledObject takes it over: said once, in an Event.
    keda = hpa("keda-hpa-resnet", "resnet", {"scaledobject.keda.sh/name": "resnet"})
    keda["spec"]["scaleTargetRef"] = {"apiVersion": "apps/v1", "kind": "Deployment"} | {
        "name": "resnet"
    }
    custom.create_namespaced_custom_object(
        "autoscaling", "v2", "default", "horizontalpodautoscalers", keda
    )
    said = await eventually(lambda: events("KEDAScaledObject"), what="the KEDA Event")
    assert said[0].startswith("KEDA ScaledObject resnet scales it")


async def test_a_deployment_whose_pods_the_binder_did_not_place_is_not_scaled(
    binder: Binder, core: Any, kube_api: kubernetes.client.ApiClient, counts: Counts
) -> None:
    """A pod created on a node directly proves nothing and may answer anything: its Deployment
    is left alone, with a Warning Event that names the pod."""
    apps = apps_v1(kube_api)
    apps.create_namespaced_deployment("default", deployment("resnet"))
    await own_pod(core, "default", "resnet", "resnet-0", counts.address, placed=False)
    said = await eventually(
        lambda: deployment_events(core, "default", "resnet", "NotModelPods"),
        what="the NotModelPods Event",
    )
    assert said[0].startswith("its pod default/resnet-0 is not a model pod placed by"), said
    counts.concurrency = 3.0
    # Three periods with a load that scales within seconds above: neither read nor scaled.
    await asyncio.sleep(3 * binder.settings.autoscale_period_seconds)
    assert counts.reads == 0
    assert apps.read_namespaced_deployment("resnet", "default").spec.replicas == 1
    assert not deployment_events(core, "default", "resnet", "BuiltIn")


async def test_a_deployment_of_on_demand_model_pods_at_min_scale_0_keeps_one_pod(
    binder: Binder, core: Any, kube_api: kubernetes.client.ApiClient, counts: Counts
) -> None:
    """min-scale 0 on a Deployment of on-demand model pods: a whole window without a request
    leaves it one pod (its model unloaded while idle), never none, and one Event says so."""
    apps = apps_v1(kube_api)
    apps.create_namespaced_deployment(
        "default", deployment("resnet", min_scale="0", residency="on-demand")
    )
    await own_pod(core, "default", "resnet", "resnet-0", counts.address)
    # One read a tick: ten reads span more than the 6 s window without a request, after
    # which a Deployment at min-scale 0 would have been asked for zero.
    period = binder.settings.autoscale_period_seconds
    await eventually(lambda: counts.reads >= 10, within=20 * period, what="ten reads")
    assert apps.read_namespaced_deployment("resnet", "default").spec.replicas == 1
    assert deployment_events(core, "default", "resnet", "SuccessfulRescale") == []
    [said] = deployment_events(core, "default", "resnet", "BuiltIn")
    assert "1 to 3 replicas" in said, said
    assert said.endswith(
        "; autoscaling.knative.dev/min-scale 0 on a Deployment of model pods keeps one pod: "
        "its model is unloaded while idle (residency on-demand) and its next request wakes it"
    ), said


async def test_min_scale_0_on_a_deployment_whose_pods_keep_their_model_is_refused(
    binder: Binder, core: Any, kube_api: kubernetes.client.ApiClient, counts: Counts
) -> None:
    """Its pods' model would hold GPU memory all the time, and no pod would leave its Service
    with nothing to hold a request: the setting is refused with a Warning that says what to
    do, and the Deployment is left as it is."""
    apps = apps_v1(kube_api)
    apps.create_namespaced_deployment("default", deployment("resnet", min_scale="0"))
    await own_pod(core, "default", "resnet", "resnet-0", counts.address)
    said = await eventually(
        lambda: [
            e
            for e in core.list_namespaced_event(
                "default", field_selector="involvedObject.kind=Deployment"
            ).items
            if e.reason == "InvalidSettings"
        ],
        what="the InvalidSettings Event",
    )
    assert said[0].type == "Warning"
    assert "set residency on-demand on its pods (tritonshare.io/residency: on-demand" in (
        said[0].message
    ), said[0].message
    assert said[0].message.endswith("or use a TritonModel with minReplicas 0"), said[0].message
    # Three periods with a load that scales within seconds: neither read nor scaled.
    counts.concurrency = 3.0
    await asyncio.sleep(3 * binder.settings.autoscale_period_seconds)
    assert counts.reads == 0
    assert apps.read_namespaced_deployment("resnet", "default").spec.replicas == 1
    assert not deployment_events(core, "default", "resnet", "BuiltIn")


class Answers:
    """Stand-ins for proxies' /autoscaling on several addresses, each answering what its
    function gives, and the times each was read."""

    def __init__(self) -> None:
        self.answer: dict[str, Callable[[], bytes]] = {}
        self.read_at: dict[str, list[float]] = {}
        self._runners: list[web.AppRunner] = []

    async def serve(self, address: str, answer: Callable[[], bytes]) -> None:
        self.answer[address] = answer
        self.read_at[address] = []

        async def handle(request: web.Request) -> web.Response:
            self.read_at[address].append(time.monotonic())
            return web.Response(body=self.answer[address](), content_type="application/json")

        app = web.Application()
        app.router.add_get(PROXY_AUTOSCALING_PATH, handle)
        runner = web.AppRunner(app)
        await runner.setup()
        self._runners.append(runner)
        await web.TCPSite(runner, address, DEFAULT_PROXY_METRICS_PORT).start()

    async def close(self) -> None:
        for runner in self._runners:
            await runner.cleanup()


@pytest.fixture
async def answers() -> AsyncIterator[Answers]:
    served = Answers()
    try:
        yield served
    finally:
        await served.close()


async def test_a_poisoned_answer_costs_only_its_own_targets(
    binder: Binder,
    core: Any,
    kube_api: kubernetes.client.ApiClient,
    answers: Answers,
    address: Callable[[], str],
) -> None:
    """A tenant's model pod answers the binder's read with, in turn, an array nested DEEP,
    NaN, Infinity and 1e400: a neighbour's Deployment (scaled after the tenant's in the
    tick) still scales on its load, and back down."""
    apps = apps_v1(kube_api)
    for namespace in ("evil", "team"):
        core.create_namespace({"metadata": {"name": namespace}})
    poisons = [
        b"[" * DEEP + b"]" * DEEP,
        b'{"evil": [NaN, NaN]}',
        b'{"evil": [Infinity, 1]}',
        b'{"evil": [1e400, 1e400]}',
    ]
    served = iter(range(1 << 30))
    evil = address()
    await answers.serve(evil, lambda: poisons[next(served) % len(poisons)])
    apps.create_namespaced_deployment("evil", deployment("evil"))
    await own_pod(core, "evil", "evil", "evil-0", evil)
    neighbour = Counts(address())
    await answers.serve(neighbour.address, lambda: json.dumps(neighbour.read()).encode())
    apps.create_namespaced_deployment("team", deployment("resnet"))
    await own_pod(core, "team", "resnet", "resnet-0", neighbour.address)
    await eventually(
        lambda: len(answers.read_at[evil]) >= 2 * len(poisons), what="every poison read"
    )
    neighbour.concurrency = 3.0
    await eventually(
        lambda: apps.read_namespaced_deployment("resnet", "team").spec.replicas == 3,
        what="the neighbour scaled to 3",
    )
    neighbour.concurrency = 0.0
    await eventually(
        lambda: apps.read_namespaced_deployment("resnet", "team").spec.replicas == 1,
        within=40,
        what="the neighbour back to 1",
    )
    # The tenant's own Deployment was never scaled on its poison.
    assert apps.read_namespaced_deployment("evil", "evil").spec.replicas == 1


async def test_a_poisoned_answer_leaves_a_neighbour_parked_at_zero_to_wake(
    binder: Binder,
    core: Any,
    kube_api: kubernetes.client.ApiClient,
    counts: Counts,
    answers: Answers,
    address: Callable[[], str],
) -> None:
    """While a tenant's pod answers an array nested DEEP, another namespace's TritonModel
    goes to zero after
    its window, is parked on its host, and the requests its host holds scale it up again."""
    apps = apps_v1(kube_api)
    custom = cast(Any, kubernetes.client.CustomObjectsApi(kube_api))
    core.create_namespace({"metadata": {"name": "evil"}})
    deep = b"[" * DEEP + b"]" * DEEP  # every read: it failed every tick, for everyone
    evil = address()
    await answers.serve(evil, lambda: deep)
    apps.create_namespaced_deployment("evil", deployment("evil"))
    await own_pod(core, "evil", "evil", "evil-0", evil)
    scaling = {"target": 1, "minReplicas": 0, "maxReplicas": 3, "window": "6s"}
    custom.create_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, model("resnet", 1, scaling)
    )
    [node] = await eventually(lambda: list(hosts(core)), what="the model's host")
    core.patch_namespaced_pod_status(
        host_name(node), "default", {"status": {"podIP": counts.address, "phase": "Running"}}
    )
    # Ready once (a model is held at one replica until its files have loaded).
    await eventually(lambda: loaded_types(core, node, "resnet"), what="its replica on the host")
    agent_loaded(core, node, "resnet")
    await eventually(lambda: replicas(custom, "resnet") == 0, within=40, what="scaled to zero")
    assert answers.read_at[evil], "the poison was read"

    def parked() -> bool:
        host = core.read_namespaced_pod(host_name(node), "default").to_dict()
        return "resnet" in parked_on(host, KEYS)

    await eventually(parked, what="parked on its host")
    counts.concurrency = 1.0  # a request held by the host
    woken = time.monotonic()
    await eventually(lambda: replicas(custom, "resnet") >= 1, what="woken")
    assert time.monotonic() - woken < 3 * binder.settings.autoscale_period_seconds + 1


PAUSED = 1000
"""Paused Deployments a tenant makes over its pods."""


async def test_a_namespace_s_targets_and_answers_cost_the_others_nothing(
    binder: Binder,
    core: Any,
    kube_api: kubernetes.client.ApiClient,
    answers: Answers,
    address: Callable[[], str],
) -> None:
    """A tenant's ten model pods answer 100 KB each (7,000 entries) and 1,000 paused
    Deployments with Knative's annotations select them: a neighbour's pod is still read every
    period, a neighbour's new pod is placed within a second, and /healthz answers within a
    second."""
    apps = apps_v1(kube_api)
    for namespace in ("evil", "team"):
        core.create_namespace({"metadata": {"name": namespace}})
    entries = {f"m{i}": [1, 1] for i in range(7000)}
    big = json.dumps(entries, separators=(",", ":")).encode()
    assert 90_000 < len(big) < 100_000
    evil = address()
    await answers.serve(evil, lambda: big)
    apps.create_namespaced_deployment("evil", deployment("evil"))
    for i in range(10):
        await own_pod(core, "evil", "evil", f"evil-{i}", evil)
    for i in range(PAUSED):
        paused = deployment(f"paused-{i}", paused=True)
        paused["spec"]["selector"]["matchLabels"] = {"app": "evil"}
        paused["spec"]["template"]["metadata"]["labels"] = {"app": "evil"}
        apps.create_namespaced_deployment("evil", paused)
    neighbour = Counts(address())
    await answers.serve(neighbour.address, lambda: json.dumps(neighbour.read()).encode())
    apps.create_namespaced_deployment("team", deployment("resnet"))
    await own_pod(core, "team", "resnet", "resnet-0", neighbour.address)
    await eventually(lambda: len(answers.read_at[evil]) >= 3, what="the tenant's pods read")

    # Ten periods: the neighbour's reads, /healthz and a new pod's placement.
    period = binder.settings.autoscale_period_seconds
    start = time.monotonic()
    slowest = 0.0
    async with aiohttp.ClientSession() as session:
        while time.monotonic() - start < 10 * period:
            asked = time.monotonic()
            async with session.get(f"http://127.0.0.1:{binder.http.port}/healthz") as response:
                assert response.status == 200
            slowest = max(slowest, time.monotonic() - asked)
            await asyncio.sleep(0.2)
    assert slowest < 1.0, f"/healthz took {slowest:.2f} s"
    reads = [t for t in answers.read_at[neighbour.address] if t >= start]
    gaps = [b - a for a, b in itertools.pairwise([start, *reads, time.monotonic()])]
    assert max(gaps) <= 2 * period, f"the neighbour's pod went unread for {max(gaps):.2f} s"
    created = time.monotonic()
    add_pod(core, "newcomer", mem="1Gi")
    await eventually(lambda: node_of(core, "newcomer"), what="the newcomer placed")
    assert time.monotonic() - created < 1.0


async def test_a_proxy_s_answer_costs_the_binder_a_bounded_read() -> None:
    """A tenant's pod answers the binder's read with whatever it likes: an answer past its
    bound is dropped unread beyond the bound, malformed entries are ignored, and an answer is
    read whole up to its bound: a host of 10,000 models with the longest ids is read."""
    host = {f"{i:04d}" + "m" * 124: [123456789.123456, 1234567890123] for i in range(10_000)}
    answers: dict[str, bytes] = {
        "huge": b'{"m": [1, 2], "pad": "' + b"x" * (8 << 20) + b'"}',
        "odd": b'{"m": [1, 2], "n": [1], "o": "x", "p": [true, 1], "q": [0.5, 3], "r": [-1, 1]}',
        "host": json.dumps(host).encode(),
    }

    async def answer(request: web.Request) -> web.Response:
        return web.Response(body=answers[request.match_info["which"]])

    app = web.Application()
    app.router.add_get("/{which}" + PROXY_AUTOSCALING_PATH, answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            base = f"http://127.0.0.1:{port}"
            assert await read_counts(session, f"{base}/huge") == {}
            assert await read_counts(session, f"{base}/odd") == {"m": (1.0, 2.0), "q": (0.5, 3.0)}
            assert await read_counts(session, "http://127.0.0.1:1") == {}  # nothing listens
            assert len(answers["host"]) > 1 << 20
            read = await read_counts(session, f"{base}/host", answer_bound(10_000, 4 << 20))
            assert len(read) == 10_000
            assert read["0042" + "m" * 124] == (123456789.123456, 1234567890123.0)
            # The same answer from a pod that serves one model is not read.
            assert await read_counts(session, f"{base}/host", answer_bound(1, 4 << 20)) == {}
    finally:
        await runner.cleanup()
