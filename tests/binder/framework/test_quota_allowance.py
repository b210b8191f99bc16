"""A GPU-memory quota counts what the binder books, the per-process allowance included, as
Kubernetes counts a pod's overhead against its namespace's quota: the rule (binder.framework.quota),
then many small models that declare no backend (each booked its request plus the allowance) under a
1Gi quota, as TritonModel replicas and as model pods, against the simulated API server through
the official client, and `tritonshare quota` showing the allowance in the namespace's use."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest

from binder.app import Binder
from binder.cluster.ledger import Ledger
from binder.cluster.objects import pod_from_api
from binder.framework.quota import Limit, QuotaCheck, limits_from_api, pods_allowance_in
from common.contract import Keys
from tests.binder.cli.test_cli_output import run_cli
from tests.binder.framework.test_model_quota import KEY, _quota
from tests.binder.framework.test_placement import cluster
from tests.binder.objects import GI, KEYS, node_obj, pod_obj
from tests.binder.simcluster import MakeBinder, add_node, add_pod, bound, eventually, failure
from tests.binder.tritonmodels.test_tritonmodels import (  # noqa: F401 (fixtures)
    GROUP,
    PLURAL,
    VERSION,
    apiserver,
    custom,
    model,
)

MIB = 1 << 20
ALLOWANCE = 640 * MIB
SMALL = 64 * MIB
BOOKED = SMALL + ALLOWANCE  # 704Mi
MODELS = 16


def advice(requested: str = "704Mi", allowance: str = "640Mi") -> str:
    return (
        f"; {allowance} of the {requested} requested is the process allowance, booked for a model"
        " that may run in a process of its own (the Python backend): a model that runs in"
        f" Triton's process books none once its pod or TritonModel declares its backend in the"
        f" annotation {KEYS.backend} (onnxruntime, openvino, pytorch, tensorflow or tensorrt)"
    )


def test_a_charge_past_the_quota_says_how_much_of_it_is_the_allowance() -> None:
    check = QuotaCheck(limits_from_api([_quota("gpu", {KEY: "1Gi"}, {KEY: "0"})], Keys()), 0)
    assert check.refusal(BOOKED, ALLOWANCE) == ""
    check.charge(BOOKED)
    assert check.refusal(BOOKED, ALLOWANCE) == (
        f"exceeded quota: gpu, requested: {KEY}=704Mi, used: {KEY}=704Mi, limited: {KEY}=1Gi"
        + advice()
    )
    # A model that declares an in-process backend books no allowance, and is told nothing of it.
    assert check.refusal(512 * MIB) == (
        f"exceeded quota: gpu, requested: {KEY}=512Mi, used: {KEY}=704Mi, limited: {KEY}=1Gi"
    )


def test_the_placed_pods_allowance_counts_on_top_of_what_the_api_server_counted() -> None:
    """The API server counts a pod's request alone (1Gi of pods here); the allowance booked for
    the pods the binder placed is counted on top, on a stale status too, and by a quota scoped
    by PriorityClass for the pods of the classes it selects only."""
    limits = limits_from_api([_quota("gpu", {KEY: "4Gi"}, {KEY: "1Gi"})], Keys())
    check = QuotaCheck(limits, 0, pods_placed=GI, pods_allowance={"gpu": ALLOWANCE})
    assert check.refusal(3 * GI - ALLOWANCE) == ""
    assert check.refusal(3 * GI - ALLOWANCE + 1).startswith("exceeded quota: gpu")
    stale = limits_from_api([_quota("gpu", {KEY: "4Gi"}, {KEY: "0"})], Keys())
    check = QuotaCheck(stale, 0, pods_placed=GI, pods_allowance={"gpu": ALLOWANCE})
    assert check.refusal(3 * GI - ALLOWANCE + 1).startswith("exceeded quota: gpu")
    limits_key = "limits.tritonshare.io/gpu-mem"
    [limit] = limits_from_api([_quota("gpu", {limits_key: "2Gi"}, {})], Keys())
    check = QuotaCheck([limit], 0, pods_placed=GI, pods_allowance={"gpu": ALLOWANCE})
    assert check.refusal(GI - ALLOWANCE) == ""
    assert check.refusal(GI - ALLOWANCE + 1).startswith("exceeded quota: gpu")

    # Placed pods of two classes, one in-process: a quota scoped to a class counts its own.
    ledger = Ledger(cluster(node_obj("gpu-1", [16 * GI])))
    for name, backend, priority_class in [
        ("a", None, "urgent"),
        ("b", None, ""),
        ("c", "onnxruntime", "urgent"),
    ]:
        annotations = {KEYS.backend: backend} if backend else {}
        spec = {"priorityClassName": priority_class} if priority_class else {}
        obj = pod_obj(name, mem="64Mi", annotations=annotations, spec_extra=spec)
        pod = pod_from_api(obj, KEYS, allowance=ALLOWANCE)
        ledger.state.assume(pod, "gpu-1", ledger.state.nodes["gpu-1"].gpus[0].uuid)
    urgent = {"scopeName": "PriorityClass", "operator": "In", "values": ["urgent"]}
    scoped = {"spec": {"scopeSelector": {"matchExpressions": [urgent]}}}
    assert pods_allowance_in(ledger, "models", _quota("all", {KEY: "1Gi"})) == 2 * ALLOWANCE
    assert pods_allowance_in(ledger, "models", scoped) == ALLOWANCE
    ledger.state.remove_pod("uid-models-a")
    assert pods_allowance_in(ledger, "models", scoped) == 0
    assert ledger.state.tallies.pods_allowance == {"models": {"": ALLOWANCE}}


@pytest.fixture
async def booking(
    kube_api: kubernetes.client.ApiClient,
    make_binder: MakeBinder,
    apiserver: Any,  # noqa: F811 (serves the CRDs)
) -> Binder:
    """A leader that books the allowance and publishes it (so `tritonshare quota` counts as it
    does), with one 16Gi GPU: room for every model, so only the quota holds them back."""
    add_node(kube_api, "gpu-1", [16 * GI])
    return await make_binder(leader_elect=True, gpu_mem_process_allowance=ALLOWANCE)


def booked(binder: Binder) -> int:
    return 16 * GI - sum(binder.cache.state.memory.free("gpu-1"))


def quota_row(kubeconfig: Path) -> dict[str, Any]:
    code, text = run_cli(kubeconfig, "quota", "default", "-o", "json")
    assert code == 0, text
    [row] = json.loads(text)["quotas"]
    return dict(row)


async def test_replicas_that_declare_no_backend_book_no_more_than_the_quota(
    booking: Binder,
    custom: Any,  # noqa: F811
    core: Any,
    kubeconfig: Path,
) -> None:
    """16 TritonModels of 64Mi without a backend annotation, each booked 64Mi + 640Mi, under a
    1Gi quota: one is placed (704Mi), not all 16 (11Gi); the others say why and what to do, and
    one that declares an in-process backend then fits in what is left."""
    core.create_namespaced_resource_quota("default", _quota("gpu", {KEY: "1Gi"}))
    names = [f"m{i}" for i in range(MODELS)]
    for name in names:
        custom.create_namespaced_custom_object(
            GROUP, VERSION, "default", PLURAL, model(name, 1, "64Mi")
        )

    def decided() -> tuple[list[str], dict[str, Any]] | None:
        found = custom.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL)["items"]
        placed, refused = [], {}
        for obj in found:
            status = obj.get("status") or {}
            name = obj["metadata"]["name"]
            conditions = [c for c in status.get("conditions") or [] if c["type"] == "Placed"]
            if status.get("placements"):
                placed.append(name)
            elif conditions and conditions[0]["status"] == "False":
                refused[name] = conditions[0]
        return (placed, refused) if len(placed) + len(refused) == MODELS else None

    placed, refused = await eventually(decided, what="every TritonModel placed or refused")
    assert booked(booking) <= GI, f"{len(placed)} replicas booked {booked(booking)} bytes"
    assert len(placed) == 1
    for name, condition in refused.items():
        assert condition["reason"] == "ExceededQuota"
        assert condition["message"] == (
            f'tritonmodel "{name}" replica 0: exceeded quota: gpu, requested: {KEY}=704Mi,'
            f" used: {KEY}=704Mi, limited: {KEY}=1Gi" + advice()
        )
    assert quota_row(kubeconfig) == {
        "namespace": "default",
        "quota": "gpu",
        "key": KEY,
        "hard": GI,
        "pods": 0,
        "replicas": BOOKED,
        "used": BOOKED,
        "allowance": ALLOWANCE,
    }

    # The advice followed: declared in-process, a refused model books its 64Mi alone and fits.
    onnx = next(iter(refused))
    custom.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        "default",
        PLURAL,
        onnx,
        {"metadata": {"annotations": {KEYS.backend: "onnxruntime"}}},
    )

    def placed_too() -> bool:
        obj = custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, onnx)
        return bool((obj.get("status") or {}).get("placements"))

    await eventually(placed_too, what=f"{onnx} placed once it declares onnxruntime")
    assert booked(booking) == BOOKED + SMALL
    row = await eventually(
        lambda: (row := quota_row(kubeconfig))["used"] == BOOKED + SMALL and row,
        what="the in-process replica in `tritonshare quota`",
    )
    assert (row["replicas"], row["allowance"]) == (BOOKED + SMALL, ALLOWANCE)
    code, text = run_cli(kubeconfig, "quota", "default")
    assert code == 0
    assert text.split("\n")[0].split() == [
        *("NAMESPACE", "QUOTA", "RESOURCE", "HARD", "PODS", "REPLICAS", "USED", "FREE"),
        "ALLOWANCE",
    ]
    assert text.split("\n")[1].split() == [
        *("default", "gpu", KEY, "1Gi", "0", "768Mi", "768Mi", "256Mi", "640Mi")
    ]


async def test_model_pods_that_declare_no_backend_book_no_more_than_the_quota(
    booking: Binder, core: Any, kubeconfig: Path
) -> None:
    """The same rule for model pods: the API server admits 16 pods of 64Mi under 1Gi (it
    counts their requests); the binder places one (704Mi) and leaves the others pending, each
    saying how much of its charge is the allowance."""
    core.create_namespaced_resource_quota("default", _quota("gpu", {KEY: "1Gi"}))
    add_pod(core, "p0", mem="64Mi")
    await eventually(lambda: bound(core, ["p0"]), what="the first pod placed")
    pods = [f"p{i}" for i in range(1, MODELS)]
    for pod in pods:
        add_pod(core, pod, mem="64Mi")

    def decided() -> tuple[dict[str, str], dict[str, str]] | None:
        placed = bound(core, pods)
        refused = {p: failure(core, p) for p in pods if p not in placed and failure(core, p)}
        return (placed, refused) if len(placed) + len(refused) == len(pods) else None

    _, refused = await eventually(decided, what="every pod placed or refused")
    assert booked(booking) <= GI, f"{1 + len(pods) - len(refused)} pods booked {booked(booking)}"
    assert sorted(refused) == sorted(pods)
    for message in refused.values():
        assert message.startswith(f"exceeded quota: gpu, requested: {KEY}=704Mi, used: {KEY}=")
        assert message.endswith(f", limited: {KEY}=1Gi" + advice())

    # The API server counts the 16 pods' requests (1Gi); the binder adds p0's allowance.
    row = await eventually(
        lambda: (row := quota_row(kubeconfig))["pods"] == GI + ALLOWANCE and row,
        what="the pods' use in `tritonshare quota`",
    )
    assert (row["replicas"], row["used"], row["allowance"]) == (0, GI + ALLOWANCE, ALLOWANCE)


def _one_by_one(check: QuotaCheck, request: int, allowance: int, most: int) -> tuple[int, str]:
    """How many replicas `refusal` lets in, each charged before the next is asked, and the
    refusal of the first it does not (at most `most`)."""
    for count in range(most + 1):
        refused = check.refusal(request, allowance)
        if refused:
            return count, refused
        check.charge(request)
    raise AssertionError(f"more than {most} replicas fit")


@pytest.mark.parametrize("seed", range(60))
def test_a_turns_room_is_what_charging_replicas_one_by_one_allows(seed: int) -> None:
    # A model's turn counts its replicas down from `room` instead of asking every quota per
    # replica: for any quotas, keys, uses, scopes and sizes, both say the same.
    rng = random.Random(seed)
    keys = [KEY, "limits.tritonshare.io/gpu-mem", "tritonshare.io/gpu-mem"]
    limits, scoped = [], {}
    for name in ["a", "b", "c"][: rng.randint(1, 3)]:
        for key in rng.sample(keys, rng.randint(1, 3)):
            hard = rng.randint(0, 40) * 256 * MIB + rng.choice([0, 1000])
            used = None if rng.random() < 0.1 else rng.randint(0, 8) * 256 * MIB
            limits.append(Limit(name, key, hard, str(hard), used, "BinarySI"))
        if rng.random() < 0.4:
            scoped[name] = rng.randint(0, 8) * 256 * MIB
    request = rng.choice([0, rng.randint(1, 8) * 256 * MIB, rng.randint(1, 3 * GI)])
    allowance = rng.choice([0, min(request, ALLOWANCE)])

    def check() -> QuotaCheck:
        return QuotaCheck(
            list(limits),
            rng_charged,
            dict(scoped),
            pods_placed=placed,
            pods_allowance={"a": ALLOWANCE} if seed % 2 else {},
        )

    rng_charged, placed = rng.randint(0, 8) * 256 * MIB, rng.randint(0, 8) * 256 * MIB
    counted = check()
    room, exceeded = counted.room(request, allowance)
    assert not counted.refused, "room does not mark the check refused"
    if request == 0 and room > 200:
        assert exceeded == "" and check().refusal(request, allowance) == ""
        return
    assert (room, exceeded) == _one_by_one(check(), request, allowance, 200)
    # Once `booked` bytes leave again, the check answers as it would have with them gone.
    gone = check()
    gone.charge(request * room)
    assert counted.refusal_after(
        request * room - request, request, allowance
    ) == gone.refusal_after(-request, request, allowance)
