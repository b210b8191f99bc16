"""The alerts (deploy/monitoring/prometheus-rule.yaml, and the chart's same rule) fire when they
should and stay quiet otherwise, on the metric names the parts really export.

`promtool test rules` (Debian's `prometheus` package) runs each alert on synthetic series shaped
as Prometheus scrapes them through the PodMonitors (job `<namespace>/<PodMonitor>`, the pod's
namespace, pod and container, the proxy's `model_id` from its annotation). The metric names are
checked against the collectors the agent, the binder and the proxy register.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.gpus.memory import MemoryLedger
from agent.metrics import AgentMetrics
from binder.cluster.clusterstate import ClusterState
from binder.framework.noderules import NODE_RULES
from binder.metrics import Metrics as BinderMetrics
from proxy.gateway.callerbook import CallerBook
from proxy.gateway.metrics import GatewayMetrics
from proxy.metrics import ProxyMetrics
from proxy.policy.holdings import ByteBudget
from proxy.policy.limiter import Limiter
from proxy.policy.share import LoopShares
from tests.conftest import require_executable
from tests.deploy.rendering import DEPLOY
from tests.deploy.test_dashboard import METRIC
from tests.proxy.test_residency import Clock, FakeAgent, residency

RULE = DEPLOY / "monitoring" / "prometheus-rule.yaml"
ALERTS = {
    "TritonshareAgentDown",
    "TritonshareNodePodsMissing",
    "TritonshareNodeDaemonSetUnavailable",
    "TritonshareTritonDown",
    "TritonshareTritonRestarting",
    "TritonshareModelNotServed",
    "TritonshareModelOverGPUMemoryRequest",
    "TritonshareGatewayShedding",
    "TritonshareGatewayRestarting",
    "TritonshareGPUUnhealthy",
    "TritonshareForeignGPUProcess",
    "TritonsharePodsPendingLong",
    "TritonshareModelLoadFailures",
    "TritonshareModelQuarantined",
    "TritonsharePodRequestsQuarantined",
    "TritonshareModelWakesFailing",
    "TritonshareProxyRejecting",
    "TritonshareGatewayWithoutCallers",
    "TritonshareNoBinderLeader",
    "TritonshareWebhookUnavailable",
}
RUNBOOKS = DEPLOY.parent / "docs" / "runbooks.md"
RUNBOOK_URL = "https://github.com/tritonshare/tritonshare/blob/main/docs/runbooks.md#"


def rules() -> list[dict[str, Any]]:
    rule = yaml.safe_load(RULE.read_text())
    return [r for group in rule["spec"]["groups"] for r in group["rules"]]


def _never(delay: float, callback: Callable[[], None]) -> None:
    """A timer that never fires: the budget is built only to list its metrics."""


def exported_families() -> set[str]:
    """Every metric family the parts register, by the name Prometheus scrapes (counters _total)."""
    agent = AgentMetrics()
    agent.watch_gpus(lambda: None, dict)
    agent.watch_foreign(dict)
    agent.watch_memory(MemoryLedger(), lambda: None)
    agent.watch_models(dict)
    agent.watch_quarantine(list)
    proxy = ProxyMetrics(Limiter(0, 0, 0.0), "m")
    proxy.residency(residency(Clock(), FakeAgent())[0])  # an on-demand model's families
    registries = [
        agent.registry,
        BinderMetrics(state=ClusterState(rules=NODE_RULES, reserve=0)).registry,
        proxy.registry,
        GatewayMetrics(
            CallerBook(Path("/nonexistent"), max_age=60),
            list,
            ByteBudget(1024, LoopShares(1.0, _never)),
        ).registry,
    ]
    names = set()
    for registry in registries:
        for family in registry.collect():
            names.add(family.name + ("_total" if family.type == "counter" else ""))
    return names


def test_the_rule_has_each_alert_the_operators_asked_for() -> None:
    assert {r["alert"] for r in rules()} == ALERTS
    for rule in rules():
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def test_each_alert_links_its_runbook_page() -> None:
    """Each runbook_url is docs/runbooks.md at the alert's own heading (GitHub's anchor)."""
    headings = {
        line.removeprefix("## ").strip().lower()
        for line in RUNBOOKS.read_text().splitlines()
        if line.startswith("## ")
    }
    for rule in rules():
        url = rule["annotations"]["runbook_url"]
        assert url == RUNBOOK_URL + rule["alert"].lower(), url
        assert rule["alert"].lower() in headings, f"docs/runbooks.md has no {rule['alert']}"


def test_alerts_query_only_metrics_the_parts_export() -> None:
    exported = exported_families()
    assert "tritonshare_agent_load_failures_total" in exported
    for rule in rules():
        for name in METRIC.findall(rule["expr"]):
            assert name in exported, f"{rule['alert']} queries {name}, which no part exports"


def _alerts_test(rule_file: Path) -> dict[str, Any]:
    """Input series and the alerts expected at given times, per alert."""
    agent_up = 'up{job="tritonshare-system/tritonshare-node", container="agent", pod="node-a"}'
    triton_up = 'up{job="tritonshare-system/tritonshare-node", container="triton", pod="node-a"}'
    gpu = 'tritonshare_agent_gpu_healthy{gpu="1", UUID="GPU-b", product="T4", pod="node-a"}'
    healthy = 'tritonshare_agent_gpu_healthy{gpu="0", UUID="GPU-a", product="T4", pod="node-a"}'
    leader = 'tritonshare_binder_is_leader{pod="binder-0"}'
    follower = 'tritonshare_binder_is_leader{pod="binder-1"}'
    webhook = (
        'kube_deployment_status_replicas_available{namespace="tritonshare-system", '
        'deployment="tritonshare-webhook"}'
    )
    calls = (
        'apiserver_admission_webhook_rejection_count{name="model-pods.tritonshare.io", '
        'error_type="calling_webhook_error", operation="CREATE", rejection_code="500", '
        'type="admit"}'
    )
    failures = (
        'tritonshare_agent_load_failures_total{namespace="tritonshare-system", pod="node-a", '
        'reason="triton_refused"}'
    )
    exits = 'tritonshare_agent_triton_exits_total{namespace="tritonshare-system", pod="node-a"}'
    quarantine_exits = (
        'tritonshare_agent_triton_exits_total{namespace="tritonshare-system", pod="node-b"}'
    )
    rejected = (
        'tritonshare_proxy_rejected_requests_total{namespace="models", pod="add-one-1", '
        'model="add_one", reason="QueueFullError"}'
    )
    quiet = (
        'tritonshare_proxy_rejected_requests_total{namespace="models", pod="add-one-2", '
        'model="add_one", reason="RouteRefusedError"}'
    )
    quarantined = (
        'tritonshare_agent_quarantined_models{namespace="tritonshare-system", pod="node-a", '
        'model_namespace="team-a", model_id="crasher", digest="0123456789abcdef"}'
    )
    # As Prometheus stores it: the metric's own `pod` (the model pod) became exported_pod.
    requests_quarantined = (
        'tritonshare_agent_quarantined_pods{namespace="tritonshare-system", pod="node-a", '
        'model_namespace="team-b", exported_pod="attacker-0", model_id="echo"}'
    )
    wakes = (
        'tritonshare_proxy_model_wakes_total{namespace="models", pod="%s", model="m", outcome="%s"}'
    )
    stale = 'tritonshare_gateway_caller_table_age_seconds{pod="node-a", container="gateway"}'
    fresh = 'tritonshare_gateway_caller_table_age_seconds{pod="node-b", container="gateway"}'
    daemonset = (
        'kube_daemonset_status_number_unavailable{namespace="tritonshare-system", '
        'daemonset="tritonshare-node"}'
    )
    triton_b = 'up{job="tritonshare-system/tritonshare-node", container="triton", pod="node-b"}'
    proxies = 'up{job="tritonshare-system/tritonshare-model-proxies", namespace="models", pod="%s"}'
    ready = 'kube_pod_status_ready{namespace="models", pod="%s", condition="true"}'
    where = 'gpu="0", UUID="GPU-a", pod="node-a"'
    measured = 'tritonshare_agent_model_gpu_memory_bytes{model="%s", ' + where + "}"
    requested = 'tritonshare_agent_model_gpu_memory_request_bytes{model="%s", ' + where + "}"
    info = (
        'tritonshare_agent_model_info{model="%s", model_namespace="models", model_pod="%s", '
        'model_id="%s", pod="node-a"}'
    )
    sheds = 'tritonshare_gateway_budget_sheds_total{pod="node-a", container="gateway"}'
    starts = 'tritonshare_gateway_process_starts{pod="node-a", container="gateway"}'
    steady = 'tritonshare_gateway_process_starts{pod="node-b", container="gateway"}'
    foreign = 'tritonshare_agent_gpu_foreign_processes{gpu="0", UUID="GPU-a", pod="node-a"}'
    no_foreign = 'tritonshare_agent_gpu_foreign_processes{gpu="1", UUID="GPU-b", pod="node-a"}'
    return {
        "rule_files": [str(rule_file)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    # The agent stops answering at minute 3; Triton keeps answering.
                    {"series": agent_up, "values": "1 1 1 0x20"},
                    {"series": triton_up, "values": "1x23"},
                    # GPU 1 goes unhealthy at minute 5; GPU 0 stays healthy.
                    {"series": gpu, "values": "1x4 0x20"},
                    {"series": healthy, "values": "1x24"},
                    # Two pods pending from minute 2 on (the leader and the follower agree).
                    {
                        "series": 'tritonshare_binder_pending_pods{pod="binder-0"}',
                        "values": "0 0 2x30",
                    },
                    {
                        "series": 'tritonshare_binder_pending_pods{pod="binder-1"}',
                        "values": "0 0 2x30",
                    },
                    # One failed load at minute 4.
                    {"series": failures, "values": "0x3 1x26"},
                    # Triton exits at minutes 2, 3, 4 and 5 on one node; three times (a crash
                    # quarantine's count) on another.
                    {"series": exits, "values": "0 0 1 2 3 4x30"},
                    {"series": quarantine_exits, "values": "0 0 1 2 3x30"},
                    # A model is quarantined at minute 4 (the series appears then).
                    {"series": quarantined, "values": "_x4 1x20"},
                    # A pod's requests are quarantined at minute 5.
                    {"series": requests_quarantined, "values": "_x5 1x20"},
                    # sleepy-1's wakes fail once a minute from minute 3, sleepy-2's once in
                    # all (and its wakes succeed).
                    {"series": wakes % ("sleepy-1", "failed"), "values": "0x3 1+1x20"},
                    {"series": wakes % ("sleepy-2", "failed"), "values": "0x3 1x20"},
                    {"series": wakes % ("sleepy-2", "ok"), "values": "0+1x24"},
                    # One proxy refuses 60 requests a minute (1/s) from minute 0; another 1 a
                    # minute (1/60 s), under the threshold.
                    {"series": rejected, "values": "0+60x30"},
                    {"series": quiet, "values": "0+1x30"},
                    # The agent stops refreshing the caller table at minute 0: its age grows
                    # a minute a minute; another node's stays fresh.
                    {"series": stale, "values": "0+60x30"},
                    {"series": fresh, "values": "5x30"},
                    # The leader stops leading at minute 3 and the follower never takes over.
                    {"series": leader, "values": "1x2 0x30"},
                    {"series": follower, "values": "0x33"},
                    # The webhook's replicas are all gone from minute 4 to minute 12; from
                    # minute 20 they are there but the API server's calls to it fail.
                    {"series": webhook, "values": "2x3 0x8 2x30"},
                    {"series": calls, "values": "0x19 0+30x20"},
                    # Every node pod's agent series ends at minute 23 (agent_up above): from
                    # minute 28, past the 5 m lookback, none is scraped.
                    # One node pod of the DaemonSet unavailable from minute 3.
                    {"series": daemonset, "values": "0x2 1x30"},
                    # Triton on node-b stops answering at minute 1.
                    {"series": triton_b, "values": "1 0x30"},
                    # add-one-1's proxy runs and its pod turns not ready at minute 3;
                    # add-one-2 is not ready but its proxy never started (still in its
                    # loader: the load-failure alert's case); add-one-3 is ready.
                    {"series": proxies % "add-one-1", "values": "1x33"},
                    {"series": ready % "add-one-1", "values": "1x2 0x30"},
                    {"series": ready % "add-one-2", "values": "0x33"},
                    {"series": proxies % "add-one-3", "values": "1x33"},
                    {"series": ready % "add-one-3", "values": "1x33"},
                    # models_a grows past its 1000-byte request at minute 4; models_b stays
                    # under its own.
                    {"series": measured % "models_a", "values": "500x3 1500x30"},
                    {"series": requested % "models_a", "values": "1000x33"},
                    {"series": info % ("models_a", "add-one-1", "add_one"), "values": "1x33"},
                    {"series": measured % "models_b", "values": "900x33"},
                    {"series": requested % "models_b", "values": "1000x33"},
                    {"series": info % ("models_b", "add-one-3", "add_one"), "values": "1x33"},
                    # The gateway sheds once at minute 6.
                    {"series": sheds, "values": "0x5 1x30"},
                    # One gateway's keeper starts it again at minute 6; another never.
                    {"series": starts, "values": "1x5 2x30"},
                    {"series": steady, "values": "1x35"},
                    # A process that is not Triton's appears on GPU 0 at minute 3; GPU 1 has none.
                    {"series": foreign, "values": "0x2 1x30"},
                    {"series": no_foreign, "values": "0x33"},
                ],
                "alert_rule_test": [
                    # Down for 2 minutes: not yet (for: 5m); down for 6: firing.
                    {"eval_time": "5m", "alertname": "TritonshareAgentDown", "exp_alerts": []},
                    {
                        "eval_time": "9m",
                        "alertname": "TritonshareAgentDown",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "critical",
                                    "job": "tritonshare-system/tritonshare-node",
                                    "container": "agent",
                                    "pod": "node-a",
                                },
                            }
                        ],
                    },
                    {"eval_time": "6m", "alertname": "TritonshareGPUUnhealthy", "exp_alerts": []},
                    # Seen from minute 3: not yet at 4 (for: 2m), firing at 6, for GPU 0 only.
                    {
                        "eval_time": "4m",
                        "alertname": "TritonshareForeignGPUProcess",
                        "exp_alerts": [],
                    },
                    {
                        "eval_time": "6m",
                        "alertname": "TritonshareForeignGPUProcess",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "warning",
                                    "gpu": "0",
                                    "UUID": "GPU-a",
                                    "pod": "node-a",
                                },
                            }
                        ],
                    },
                    {
                        "eval_time": "8m",
                        "alertname": "TritonshareGPUUnhealthy",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "critical",
                                    "gpu": "1",
                                    "UUID": "GPU-b",
                                    "product": "T4",
                                    "pod": "node-a",
                                },
                            }
                        ],
                    },
                    {
                        "eval_time": "15m",
                        "alertname": "TritonsharePodsPendingLong",
                        "exp_alerts": [],
                    },
                    {
                        "eval_time": "18m",
                        "alertname": "TritonsharePodsPendingLong",
                        "exp_alerts": [{"exp_labels": {"severity": "warning"}}],
                    },
                    {
                        "eval_time": "4m",
                        "alertname": "TritonshareTritonRestarting",
                        "exp_alerts": [],
                    },
                    {
                        "eval_time": "6m",
                        "alertname": "TritonshareTritonRestarting",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "warning",
                                    "namespace": "tritonshare-system",
                                    "pod": "node-a",
                                },
                            }
                        ],
                    },
                    # Fifteen minutes after the exits, they have left the window.
                    {
                        "eval_time": "25m",
                        "alertname": "TritonshareTritonRestarting",
                        "exp_alerts": [],
                    },
                    {
                        "eval_time": "3m",
                        "alertname": "TritonshareModelLoadFailures",
                        "exp_alerts": [],
                    },
                    {
                        "eval_time": "6m",
                        "alertname": "TritonshareModelLoadFailures",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "warning",
                                    "namespace": "tritonshare-system",
                                    "pod": "node-a",
                                    "reason": "triton_refused",
                                },
                            }
                        ],
                    },
                    # Ten minutes after the one failure, it has left the window.
                    {
                        "eval_time": "20m",
                        "alertname": "TritonshareModelLoadFailures",
                        "exp_alerts": [],
                    },
                    # Over 90 s old from minute 2, firing 2 minutes later.
                    {
                        "eval_time": "3m",
                        "alertname": "TritonshareGatewayWithoutCallers",
                        "exp_alerts": [],
                    },
                    {
                        "eval_time": "5m",
                        "alertname": "TritonshareGatewayWithoutCallers",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "critical",
                                    "pod": "node-a",
                                    "container": "gateway",
                                },
                            }
                        ],
                    },
                    {"eval_time": "4m", "alertname": "TritonshareNoBinderLeader", "exp_alerts": []},
                    {
                        "eval_time": "6m",
                        "alertname": "TritonshareNoBinderLeader",
                        "exp_alerts": [{"exp_labels": {"severity": "critical"}}],
                    },
                    {
                        "eval_time": "5m",
                        "alertname": "TritonshareWebhookUnavailable",
                        "exp_alerts": [],
                    },
                    {
                        "eval_time": "7m",
                        "alertname": "TritonshareWebhookUnavailable",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "critical",
                                    "namespace": "tritonshare-system",
                                    "deployment": "tritonshare-webhook",
                                }
                            }
                        ],
                    },
                    {
                        "eval_time": "16m",
                        "alertname": "TritonshareWebhookUnavailable",
                        "exp_alerts": [],
                    },
                    {
                        "eval_time": "24m",
                        "alertname": "TritonshareWebhookUnavailable",
                        "exp_alerts": [{"exp_labels": {"severity": "critical"}}],
                    },
                    {
                        "eval_time": "30m",
                        "alertname": "TritonshareNodePodsMissing",
                        "exp_alerts": [],
                    },
                    {
                        "eval_time": "40m",
                        "alertname": "TritonshareNodePodsMissing",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "critical",
                                    "job": "tritonshare-system/tritonshare-node",
                                    "container": "agent",
                                }
                            }
                        ],
                    },
                    {
                        "eval_time": "16m",
                        "alertname": "TritonshareNodeDaemonSetUnavailable",
                        "exp_alerts": [],
                    },
                    {
                        "eval_time": "19m",
                        "alertname": "TritonshareNodeDaemonSetUnavailable",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "warning",
                                    "namespace": "tritonshare-system",
                                    "daemonset": "tritonshare-node",
                                }
                            }
                        ],
                    },
                    {"eval_time": "5m", "alertname": "TritonshareTritonDown", "exp_alerts": []},
                    {
                        "eval_time": "7m",
                        "alertname": "TritonshareTritonDown",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "critical",
                                    "job": "tritonshare-system/tritonshare-node",
                                    "container": "triton",
                                    "pod": "node-b",
                                }
                            }
                        ],
                    },
                    {
                        "eval_time": "12m",
                        "alertname": "TritonshareModelNotServed",
                        "exp_alerts": [],
                    },
                    {
                        "eval_time": "14m",
                        "alertname": "TritonshareModelNotServed",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "warning",
                                    "namespace": "models",
                                    "pod": "add-one-1",
                                    "condition": "true",
                                }
                            }
                        ],
                    },
                    {
                        "eval_time": "13m",
                        "alertname": "TritonshareModelOverGPUMemoryRequest",
                        "exp_alerts": [],
                    },
                    {
                        "eval_time": "15m",
                        "alertname": "TritonshareModelOverGPUMemoryRequest",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "warning",
                                    "model": "models_a",
                                    "gpu": "0",
                                    "UUID": "GPU-a",
                                    "pod": "node-a",
                                    "model_namespace": "models",
                                    "model_pod": "add-one-1",
                                    "model_id": "add_one",
                                }
                            }
                        ],
                    },
                    {
                        "eval_time": "5m",
                        "alertname": "TritonshareGatewayRestarting",
                        "exp_alerts": [],
                    },
                    {
                        "eval_time": "7m",
                        "alertname": "TritonshareGatewayRestarting",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "warning",
                                    "pod": "node-a",
                                    "container": "gateway",
                                }
                            }
                        ],
                    },
                    # Fifteen minutes after the restart, it has left the window.
                    {
                        "eval_time": "22m",
                        "alertname": "TritonshareGatewayRestarting",
                        "exp_alerts": [],
                    },
                    {
                        "eval_time": "5m",
                        "alertname": "TritonshareGatewayShedding",
                        "exp_alerts": [],
                    },
                    {
                        "eval_time": "7m",
                        "alertname": "TritonshareGatewayShedding",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "warning",
                                    "pod": "node-a",
                                    "container": "gateway",
                                }
                            }
                        ],
                    },
                    # Ten minutes after the one shed, it has left the window.
                    {
                        "eval_time": "20m",
                        "alertname": "TritonshareGatewayShedding",
                        "exp_alerts": [],
                    },
                    {
                        "eval_time": "3m",
                        "alertname": "TritonshareModelQuarantined",
                        "exp_alerts": [],
                    },
                    {
                        "eval_time": "6m",
                        "alertname": "TritonshareModelQuarantined",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "warning",
                                    "namespace": "tritonshare-system",
                                    "pod": "node-a",
                                    "model_namespace": "team-a",
                                    "model_id": "crasher",
                                },
                            }
                        ],
                    },
                    {
                        "eval_time": "4m",
                        "alertname": "TritonsharePodRequestsQuarantined",
                        "exp_alerts": [],
                    },
                    {
                        "eval_time": "6m",
                        "alertname": "TritonsharePodRequestsQuarantined",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "warning",
                                    "namespace": "tritonshare-system",
                                    "pod": "node-a",
                                    "model_namespace": "team-b",
                                    "exported_pod": "attacker-0",
                                    "model_id": "echo",
                                },
                            }
                        ],
                    },
                    # Two failed wakes by minute 5: not yet; five by minute 8: firing, for
                    # sleepy-1 only.
                    {
                        "eval_time": "5m",
                        "alertname": "TritonshareModelWakesFailing",
                        "exp_alerts": [],
                    },
                    {
                        "eval_time": "8m",
                        "alertname": "TritonshareModelWakesFailing",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "warning",
                                    "namespace": "models",
                                    "pod": "sleepy-1",
                                    "model": "m",
                                },
                            }
                        ],
                    },
                    {"eval_time": "8m", "alertname": "TritonshareProxyRejecting", "exp_alerts": []},
                    {
                        "eval_time": "20m",
                        "alertname": "TritonshareProxyRejecting",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "warning",
                                    "namespace": "models",
                                    "pod": "add-one-1",
                                    "model": "add_one",
                                    "reason": "QueueFullError",
                                },
                            }
                        ],
                    },
                ],
            }
        ],
    }


def _annotations_free(rule_file: Path, tmp_path: Path) -> Path:
    """The rule groups as a Prometheus rule file, without annotations: promtool compares an
    alert's annotations too, and these tests are about when alerts fire and with which labels
    (the annotations' templates are checked by `promtool check rules`)."""
    groups = yaml.safe_load(rule_file.read_text())["spec"]["groups"]
    for group in groups:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": groups}))
    return path


def test_the_rules_are_valid_prometheus_rules(tmp_path: Path) -> None:
    promtool = require_executable("promtool")
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": yaml.safe_load(RULE.read_text())["spec"]["groups"]}))
    result = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, f"promtool rejects the rules:\n{result.stdout}{result.stderr}"
    assert f"SUCCESS: {len(ALERTS)} rules found" in result.stdout, result.stdout


def test_each_alert_fires_when_it_should_and_not_before(tmp_path: Path) -> None:
    promtool = require_executable("promtool")
    rule_file = _annotations_free(RULE, tmp_path)
    test_file = tmp_path / "alerts_test.yml"
    test_file.write_text(yaml.safe_dump(_alerts_test(rule_file)))
    result = subprocess.run(
        [promtool, "test", "rules", str(test_file)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, f"promtool test rules:\n{result.stdout}{result.stderr}"


@pytest.mark.parametrize("alert", sorted(ALERTS))
def test_a_broken_alert_fails_its_test(tmp_path: Path, alert: str) -> None:
    """The promtool test can fail: with one alert's condition inverted, it does."""
    promtool = require_executable("promtool")
    rule_file = _annotations_free(RULE, tmp_path)
    groups = yaml.safe_load(rule_file.read_text())
    for rule in groups["groups"][0]["rules"]:
        if rule["alert"] == alert:
            rule["expr"] = f"absent({rule['expr']})"
    rule_file.write_text(yaml.safe_dump(groups))
    test_file = tmp_path / "alerts_test.yml"
    test_file.write_text(yaml.safe_dump(_alerts_test(rule_file)))
    result = subprocess.run(
        [promtool, "test", "rules", str(test_file)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0 and alert in result.stdout + result.stderr
