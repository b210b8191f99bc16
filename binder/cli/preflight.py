"""`tritonshare preflight [--pre]`: what would break tritonshare on this cluster, and how to fix it.

Reads the cluster once (version, nodes, namespaces, DaemonSets, pods, CRDs; after install also the
mutating webhooks, the system namespace's Secrets and the admission policies), asks the API
server to dry-run each DaemonSet's pod where tritonshare's GPU-node policy is installed (so the
policy is judged as the cluster itself evaluates it, whatever its rules say), and runs the pure
checks of `binder.cli.checks`. `--pre` leaves out what only an installed tritonshare has (the
node DaemonSets' fit and selection use the chart's defaults; no webhook, policy or image checks).
Text as `linkerd check` prints it (a line per check, its details and fix), or
`-o json|yaml`. Exit status: 1 when a check fails, else 0.
Changes nothing: a dry run stores nothing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import replace
from typing import TextIO
from urllib.parse import quote

from binder.api.kube import Kube
from binder.api.listwatch import NODES, PODS, Kind
from binder.cli import checks, gpunodes
from binder.cli.checks import FAIL, OK, WARN, Check, DryRun, Survey
from binder.cli.gpunodes import GpuNode
from binder.cli.report import write_document
from common.contract import Keys
from common.kubeapi.errors import ApiError, UnavailableError
from common.kubeapi.session import JsonObject

_SYMBOLS = {OK: "[ok]  ", WARN: "[warn]", FAIL: "[fail]"}
_POLICIES = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"


def _optional(kube: Kube, path: str, name: str) -> list[JsonObject]:
    """Every object at `path`; none when the kind is not served or may not be listed."""
    try:
        return kube.list_all(Kind(name, path))[0]
    except UnavailableError:
        raise
    except ApiError:
        return []


def survey(kube: Kube, keys: Keys, system_namespace: str, pre: bool) -> Survey:
    """Read what the checks need; after install, dry-run each DaemonSet's pod."""
    crds = [
        str((c.get("metadata") or {}).get("name", ""))
        for c in _optional(kube, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", "crds")
    ]
    found = Survey(
        keys=keys,
        system_namespace=system_namespace,
        version=kube.read("/version"),
        nodes=kube.list_all(NODES)[0],
        namespaces=_optional(kube, "/api/v1/namespaces", "namespaces"),
        daemonsets=_optional(kube, "/apis/apps/v1/daemonsets", "daemonsets"),
        pods=kube.list_all(PODS)[0],
        crds=crds,
    )
    if pre:
        return found
    system = system_namespace
    webhooks = _optional(
        kube, "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations", "webhooks"
    )
    secrets = _optional(kube, f"/api/v1/namespaces/{quote(system, safe='')}/secrets", "secrets")
    policies = gpu_node_policies(_optional(kube, _POLICIES, "policies"), keys)
    dry_runs: list[DryRun] | None = None
    problem = ""
    if policies:
        dry_runs, problem = dry_run_daemonsets(kube, found, policies)
    else:
        problem = "no ValidatingAdmissionPolicy names the GPU-node taint: it is not installed"
    return replace(
        found, webhooks=webhooks, secrets=secrets, dry_runs=dry_runs, dry_run_problem=problem
    )


def gpu_node_policies(policies: Sequence[JsonObject], keys: Keys) -> list[str]:
    """The names of the installed policies that are tritonshare's GPU-node policy: those whose
    rules name the GPU-node taint's key."""
    return [
        str((p.get("metadata") or {}).get("name", ""))
        for p in policies
        if keys.gpu_node in json.dumps(p.get("spec") or {})
    ]


def dry_run_daemonsets(
    kube: Kube, found: Survey, policies: Sequence[str]
) -> tuple[list[DryRun] | None, str]:
    """Each DaemonSet's pod (for a GPU node it runs on, if any) created with dryRun=All: refused
    by one of `policies`, by something else, or admitted. (None, why) when the CLI may not."""
    nodes = gpunodes.gpu_nodes(found.nodes, found.keys)
    answers = []
    for ds in found.daemonsets:
        meta = ds.get("metadata") or {}
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        on = gpunodes.gpu_nodes_of(ds, nodes, found.keys)
        pod = gpunodes.daemonset_pod(ds, on[0] if on else None)
        spec = pod["spec"]
        account = str(spec.get("serviceAccountName") or spec.get("serviceAccount") or "default")
        refused_by = message = ""
        try:
            kube.dry_run_create_pod(namespace, pod)
        except UnavailableError:
            raise
        except ApiError as e:
            if e.status == 403 and "cannot create resource" in e.message:
                return None, f"this user may not create pods in {namespace} (dry run): {e.message}"
            refused_by = next((p for p in policies if f"'{p}'" in e.message), "")
            message = refusal(e.message)
        answers.append(DryRun(namespace, name, account, refused_by, message, on))
    return answers, ""


_FORBIDDEN = re.compile(r'^pods "[^"]*" is forbidden: ')
_POLICY_DENIAL = re.compile(
    r"^ValidatingAdmissionPolicy '([^']*)' with binding '[^']*' denied request: "
)


def refusal(message: str) -> str:
    """An admission refusal without the generated pod's name: `policy P: why`, or the API
    server's words."""
    message = _FORBIDDEN.sub("", message)
    return _POLICY_DENIAL.sub(lambda m: f"policy {m[1]}: ", message)


def run_checks(found: Survey, pre: bool, now: float) -> list[Check]:
    nodes: list[GpuNode] = gpunodes.gpu_nodes(found.nodes, found.keys)
    ran = [
        checks.kubernetes_version(found.version),
        checks.pod_security(found),
        gpunodes.gpu_node_check(nodes, found.keys),
        gpunodes.node_pod_fit(found, nodes, pre),
        gpunodes.node_pools_check(found, pre),
        gpunodes.policy_check(found, nodes, pre),
        checks.cni_check(found.daemonsets),
        checks.prometheus_check(found.crds),
    ]
    if not pre:
        ran += [checks.webhook_check(found, now), checks.image_check(found)]
    return ran


def write_checks(ran: Sequence[Check], pre: bool, output: str, out: TextIO) -> None:
    verdict = checks.worst(ran)
    if output != "text":
        document = {"pre": pre, "status": verdict, "checks": [c.document() for c in ran]}
        write_document(document, output, out)
        return
    out.write("tritonshare preflight" + (" --pre (before installing)" if pre else "") + "\n")
    out.write("-" * 21 + "\n")
    for check in ran:
        out.write(f"{_SYMBOLS[check.status]} {check.name}: {check.message}\n")
        for line in check.details:
            out.write(f"    {line}\n")
        if check.status != OK and check.fix:
            out.write(f"    fix: {check.fix}\n")
    counts = {s: sum(c.status == s for c in ran) for s in (OK, WARN, FAIL)}
    out.write(
        f"\nStatus check results are {_SYMBOLS[verdict]}: {counts[OK]} ok, {counts[WARN]} "
        f"warning(s), {counts[FAIL]} failed.\n"
    )


def preflight(
    kube: Kube, keys: Keys, system_namespace: str, pre: bool, output: str, out: TextIO, now: float
) -> int:
    """The command: 1 when a check fails, else 0."""
    found = survey(kube, keys, system_namespace, pre)
    ran = run_checks(found, pre, now)
    write_checks(ran, pre, output, out)
    return 1 if checks.worst(ran) == FAIL else 0
