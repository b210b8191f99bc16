"""`tritonshare uninstall-cleanup` against the simulated API server through the official client:
it removes exactly what the agents and the binder wrote at run time (node annotations, the
advertised extended resource, their Leases), keeps everything else on the nodes, refuses while an
agent still runs, and is safe to run twice."""

from __future__ import annotations

import io
import json
import sys
import time
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest

from agent.gpus.inventory import GpuInfo, GpuSnapshot, capacity_patch, node_annotations
from binder.cli.main import main as cli
from binder.cli.uninstall import plan
from common.contract import BINDER_LEADER_LEASE, DEFAULT_SYSTEM_NAMESPACE, agent_lease_name
from tests.binder.objects import GI, KEYS, rfc3339
from tests.binder.simcluster import add_node
from tests.fixtures_sim import coordination_v1

SYSTEM = DEFAULT_SYSTEM_NAMESPACE


def _lease(name: str, renewed: float) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": SYSTEM},
        "spec": {"holderIdentity": "x", "leaseDurationSeconds": 40, "renewTime": rfc3339(renewed)},
    }


@pytest.fixture
def left_behind(kube_api: kubernetes.client.ApiClient, core: Any) -> Any:
    """gpu-1 as a stopped agent left it (its annotations, resource and Lease), beside what is
    not tritonshare's: a team's annotation and label, nvidia.com/gpu, another Lease, and gpu-2,
    whose agent stopped long ago."""
    add_node(kube_api, "gpu-1", [16 * GI], labels={"team": "vision"})
    add_node(kube_api, "gpu-2", [])
    core.patch_node(
        "gpu-1",
        {
            "metadata": {
                "annotations": {
                    KEYS.gpu_usage: json.dumps({"GPU-gpu-1-0": {"used": GI, "models": {}}}),
                    "example.com/owner": "vision",
                }
            }
        },
    )
    snapshot = GpuSnapshot(gpus=(GpuInfo(0, "GPU-gpu-1-0", "Tesla T4", 16 * GI, GI, healthy=True),))
    advertised = capacity_patch(snapshot, KEYS, {})
    assert advertised is not None
    resources = {**advertised, "nvidia.com/gpu": "1", "cpu": "8"}
    core.patch_node_status("gpu-1", {"status": {"capacity": resources, "allocatable": resources}})
    # What the agent writes is what is left: its own annotation keys, by its own function.
    on_node = core.read_node("gpu-1").metadata.annotations
    assert set(node_annotations(snapshot, KEYS)) <= set(on_node)
    leases = coordination_v1(kube_api)
    # gpu-2's agent stopped long ago.
    leases.patch_namespaced_lease(
        agent_lease_name("gpu-2"), SYSTEM, {"spec": {"renewTime": rfc3339(time.time() - 3600)}}
    )
    leases.create_namespaced_lease(SYSTEM, _lease(BINDER_LEADER_LEASE, time.time()))
    leases.create_namespaced_lease(SYSTEM, _lease("someone-elses", time.time()))
    return leases


def _run(kubeconfig: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[int, str, str]:
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    out = io.StringIO()
    code = cli(["--kubeconfig", str(kubeconfig), "uninstall-cleanup", *args], out=out)
    return code, out.getvalue(), err.getvalue()


def _lease_names(leases: Any) -> set[str]:
    return {lease.metadata.name for lease in leases.list_namespaced_lease(SYSTEM).items}


def test_uninstall_cleanup_removes_what_tritonshare_wrote_and_nothing_else(
    kubeconfig: Path, core: Any, left_behind: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    leases = left_behind
    before = core.read_node("gpu-1")
    # The agent of gpu-1 still runs (its Lease is live): it would write everything back.
    code, out, err = _run(kubeconfig, monkeypatch)
    assert code == 1 and out == ""
    assert "the agents of 1 node still run (gpu-1)" in err and "--force" in err
    assert core.read_node("gpu-1").metadata.annotations == before.metadata.annotations
    # A dry run says what it would remove and changes nothing.
    code, out, _ = _run(kubeconfig, monkeypatch, "--dry-run", "--force")
    assert code == 0
    assert out.splitlines() == [
        f"would node gpu-1: remove annotation {KEYS.gpus}, annotation {KEYS.gpu_mem_total}, "
        f"annotation {KEYS.gpu_usage}, resource {KEYS.gpu_mem}",
        f"would node gpu-2: remove annotation {KEYS.gpus}, annotation {KEYS.gpu_mem_total}",
        f"would lease {agent_lease_name('gpu-1')}: delete",
        f"would lease {agent_lease_name('gpu-2')}: delete",
        f"would lease {BINDER_LEADER_LEASE}: delete",
    ]
    assert core.read_node("gpu-1").metadata.annotations == before.metadata.annotations
    # The DaemonSet is gone: the agents' Leases run out.
    leases.patch_namespaced_lease(
        agent_lease_name("gpu-1"), SYSTEM, {"spec": {"renewTime": rfc3339(time.time() - 3600)}}
    )
    code, out, err = _run(kubeconfig, monkeypatch)
    assert (code, err) == (0, "")
    assert out.splitlines()[-1] == (
        f"Removed tritonshare's annotations and resources from 2 nodes and deleted 3 Leases in "
        f"{SYSTEM}."
    )
    node = core.read_node("gpu-1")
    assert node.metadata.annotations == {"example.com/owner": "vision"}
    assert node.metadata.labels == before.metadata.labels
    for resources in (node.status.capacity, node.status.allocatable):
        assert resources == {"nvidia.com/gpu": "1", "cpu": "8"}
    assert not core.read_node("gpu-2").metadata.annotations
    assert _lease_names(leases) == {"someone-elses"}
    # Twice is safe: nothing is left.
    code, out, _ = _run(kubeconfig, monkeypatch)
    assert code == 0 and out.startswith("Nothing to clean up")


def test_uninstall_cleanup_removes_the_binders_scale_down_guards_not_an_operators() -> None:
    guards = {
        "cluster-autoscaler.kubernetes.io/scale-down-disabled": "true",
        "karpenter.sh/do-not-disrupt": "true",
    }
    nodes = [
        {
            "metadata": {
                "name": "ours",
                "annotations": {**guards, KEYS.prefix + "scale-down-guard": ",".join(guards)},
            }
        },
        {"metadata": {"name": "theirs", "annotations": dict(guards)}},
        {
            "metadata": {
                "name": "half",
                "annotations": {
                    **guards,
                    KEYS.prefix + "scale-down-guard": "karpenter.sh/do-not-disrupt",
                },
            }
        },
    ]
    cleanup = plan(nodes, [], KEYS, time.time())
    assert cleanup.annotations == {
        "ours": [*guards, KEYS.prefix + "scale-down-guard"],
        "half": ["karpenter.sh/do-not-disrupt", KEYS.prefix + "scale-down-guard"],
    }
