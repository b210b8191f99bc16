"""deploy/'s RBAC grants exactly the API calls the binder and the agent make.

The end-to-end scenario runs the real binder and agent processes against sim/; its API server's
audit log records every call with the caller's User-Agent. Each call must be allowed by the
rules the manifests bind to that part's service account (evaluated as Kubernetes' RBAC
authorizer does), and each verb and resource a rule grants must be used by some call: a grant no
code path needs is a grant to remove. Model pods (loader and proxy) must make no API call at all.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from common.contract import DEFAULT_SYSTEM_NAMESPACE
from sim.apiserver import AuditRecord
from sim.cluster import USER_AGENT as CLUSTER_USER_AGENT
from sim.controllers.hpa import USER_AGENT as AUTOSCALER_USER_AGENT
from sim.controllers.manager import USER_AGENT as CONTROLLER_MANAGER_USER_AGENT
from sim.demo.report import DemoResult
from sim.node.kubelet import USER_AGENT as KUBELET_USER_AGENT
from tests.conftest import require_executable
from tests.deploy.rendering import render

# RBAC has no resourceNames for these verbs: a rule with resourceNames never allows them.
_UNNAMED_VERBS = frozenset({"create", "list", "watch", "deletecollection"})


_MODELS = "tests/binder/tritonmodels/test_tritonmodels.py (TritonModels: placed, hosts, Services)"
_AUTOSCALING = "tests/binder/autoscaler/test_autoscaling.py (the built-in autoscaler scales)"

_BUDGETS = "tests/binder/tritonmodels/test_host_budget.py (a TritonModel's minAvailable)"
_ISVCS = (
    "tests/binder/inferenceservices/test_inferenceservices.py (ModelMesh InferenceServices, "
    "with KServe's CRDs served)"
)

_ROUTER = (
    "tests/binder/tritonmodels/test_modelmesh_router.py (a ModelMesh namespace's "
    "modelmesh-serving Service and routes ConfigMap)"
)

# Grants only a failure the demo does not stage, or a TritonModel, uses, each with the test whose
# real process makes that call through the simulated API server.
FAILURE_PATH_GRANTS: dict[str, dict[tuple[str, str, str], str]] = {
    "tritonshare-binder": {
        ("", "pods", "delete"): "tests/e2e/test_agent_down.py (a node's agent down past the grace)",
        (
            "",
            "pods/eviction",
            "create",
        ): "tests/binder/framework/test_preemption_e2e.py (preemption)",
        ("tritonshare.io", "tritonmodels/status", "patch"): _MODELS,
        ("", "pods", "create"): _MODELS,
        ("", "services", "create"): _MODELS,
        ("", "resourcequotas", "list"): _MODELS,
        ("tritonshare.io", "tritonmodels/scale", "patch"): _AUTOSCALING,
        ("apps", "deployments/scale", "patch"): _AUTOSCALING,
        ("policy", "poddisruptionbudgets", "create"): _BUDGETS,
        ("policy", "poddisruptionbudgets", "patch"): _BUDGETS,
        ("policy", "poddisruptionbudgets", "delete"): _BUDGETS,
        **{
            ("serving.kserve.io", kind, verb): _ISVCS
            for kind in ("inferenceservices", "servingruntimes", "clusterservingruntimes")
            for verb in ("list", "watch")
        },
        ("serving.kserve.io", "inferenceservices/status", "patch"): _ISVCS,
        ("tritonshare.io", "tritonmodels", "create"): _ISVCS,
        ("tritonshare.io", "tritonmodels", "patch"): _ISVCS,
        ("", "secrets", "get"): _ISVCS,
        ("", "secrets", "create"): _ISVCS,
        ("", "configmaps", "get"): _ISVCS,
        ("", "services", "get"): _ROUTER,
        ("", "configmaps", "create"): _ROUTER,
        ("", "configmaps", "patch"): _ROUTER,
    },
}


@dataclass(frozen=True)
class Grant:
    """One (rule, verb, resource) of a role, where it applies."""

    role: str
    api_group: str
    resource: str
    verb: str
    names: frozenset[str]
    namespace: str | None
    """None for a ClusterRole bound cluster-wide, else the Role's namespace."""

    def allows(self, call: AuditRecord) -> bool:
        resource = f"{call.resource}/{call.subresource}" if call.subresource else call.resource
        if (self.api_group, self.resource, self.verb) != (call.api_group, resource, call.verb):
            return False
        if self.namespace is not None and call.namespace != self.namespace:
            return False
        if self.names:
            return call.verb not in _UNNAMED_VERBS and call.name in self.names
        return True

    def __str__(self) -> str:
        names = f" named {sorted(self.names)}" if self.names else ""
        where = f" in {self.namespace}" if self.namespace else " cluster-wide"
        group = self.api_group or "core"
        return f"{self.verb} {group}/{self.resource}{names}{where} ({self.role})"


def grants_for(account: str, objects: Iterable[Mapping[str, Any]]) -> list[Grant]:
    """Every grant bound to service account tritonshare-system/<account>."""
    objects = list(objects)
    roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o for o in objects}
    grants: list[Grant] = []
    for binding in objects:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        subjects = binding.get("subjects", [])
        if not any(
            s["kind"] == "ServiceAccount"
            and s["name"] == account
            and s.get("namespace") == DEFAULT_SYSTEM_NAMESPACE
            for s in subjects
        ):
            continue
        ref = binding["roleRef"]
        namespace = binding["metadata"].get("namespace")
        role_ns = None if ref["kind"] == "ClusterRole" else namespace
        role = roles[(ref["kind"], role_ns, ref["name"])]
        scope = namespace if binding["kind"] == "RoleBinding" else None
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        grants.append(
                            Grant(
                                f"{ref['kind']} {ref['name']}",
                                group,
                                resource,
                                verb,
                                frozenset(rule.get("resourceNames", [])),
                                scope,
                            )
                        )
    return grants


def calls_of(audit: Iterable[AuditRecord], user_agent: str) -> list[AuditRecord]:
    return [r for r in audit if r.user_agent.startswith(user_agent)]


def describe(call: AuditRecord) -> str:
    resource = f"{call.resource}/{call.subresource}" if call.subresource else call.resource
    where = f" in {call.namespace}" if call.namespace else ""
    return f"{call.verb} {call.api_group or 'core'}/{resource} {call.name}{where}".strip()


@pytest.fixture(scope="module")
def base_objects() -> tuple[dict[str, Any], ...]:
    return render(require_executable("kubectl"), "base")


@pytest.mark.slow
@pytest.mark.triton
@pytest.mark.parametrize(
    ("part", "account"),
    [("tritonshare-binder", "tritonshare-binder"), ("tritonshare-agent", "tritonshare-agent")],
)
def test_rbac_covers_exactly_the_calls_each_part_makes(
    demo_run: tuple[DemoResult, str],
    base_objects: tuple[dict[str, Any], ...],
    part: str,
    account: str,
) -> None:
    result, _ = demo_run
    calls = calls_of(result.audit, part)
    assert len(calls) > 10, f"the scenario recorded too few {part} calls to judge its RBAC"
    grants = grants_for(account, base_objects)
    assert grants, f"no RBAC is bound to service account {account}"

    denied = sorted({describe(c) for c in calls if not any(g.allows(c) for g in grants)})
    assert not denied, f"{part} makes calls its RBAC does not allow: {denied}"
    unused = [
        str(g)
        for g in grants
        if not any(g.allows(c) for c in calls)
        and (g.api_group, g.resource, g.verb) not in FAILURE_PATH_GRANTS.get(account, {})
    ]
    assert not unused, f"{account} is granted what {part} never uses: {unused}"


@pytest.mark.slow
@pytest.mark.triton
def test_model_pods_make_no_kubernetes_api_calls(demo_run: tuple[DemoResult, str]) -> None:
    result, _ = demo_run
    known = (
        "tritonshare-binder",
        "tritonshare-agent",
        "tritonshare-cli",
        KUBELET_USER_AGENT,
        CLUSTER_USER_AGENT,
        CONTROLLER_MANAGER_USER_AGENT,
        AUTOSCALER_USER_AGENT,
    )
    strangers = sorted({r.user_agent for r in result.audit if not r.user_agent.startswith(known)})
    assert not strangers, f"unexpected API callers (loader or proxy?): {strangers}"
