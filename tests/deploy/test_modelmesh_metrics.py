"""ModelMesh's metric names recorded from tritonshare's (deploy/monitoring/modelmesh-rules.yaml):
`promtool test rules` feeds each rule series shaped as Prometheus scrapes them through the
PodMonitors (a model host's proxy in its namespace, a node pod's agent and Triton in
tritonshare-system) and checks what is recorded, in ModelMesh's units and labels. Every name
ModelMesh Serving documents is either recorded or named in docs/modelmesh.md as having no
equivalent, and the rules read only metrics the parts (or Triton) export."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.metrics import AgentMetrics
from tests.conftest import require_executable
from tests.deploy.rendering import DEPLOY
from tests.deploy.test_alerts import exported_families

RULES = DEPLOY / "monitoring" / "modelmesh-rules.yaml"
DOC = DEPLOY.parent / "docs" / "modelmesh.md"
MODELMESH = [
    "modelmesh_invoke_model_milliseconds",
    "modelmesh_api_request_milliseconds",
    "modelmesh_request_size_bytes",
    "modelmesh_response_size_bytes",
    "modelmesh_cache_miss_milliseconds",
    "modelmesh_loadmodel_milliseconds",
    "modelmesh_loadmodel_failure",
    "modelmesh_unloadmodel_milliseconds",
    "modelmesh_unloadmodel_failure",
    "modelmesh_unloadmodel_attempt_failure",
    "modelmesh_req_queue_delay_milliseconds",
    "modelmesh_loading_queue_delay_milliseconds",
    "modelmesh_model_sizing_milliseconds",
    "modelmesh_age_at_eviction_milliseconds",
    "modelmesh_loaded_model_size_bytes",
    "modelmesh_models_loaded_total",
    "modelmesh_models_with_failure_total",
    "modelmesh_models_managed_total",
    "modelmesh_instance_lru_seconds",
    "modelmesh_instance_lru_age_seconds",
    "modelmesh_instance_capacity_bytes",
    "modelmesh_instance_used_bytes",
    "modelmesh_instance_used_bps",
    "modelmesh_instance_models_total",
]
"""Every metric ModelMesh Serving's docs/monitoring.md lists."""
TRITON = {
    "nv_inference_request_duration_us",
    "nv_inference_request_success",
    "nv_inference_request_failure",
}
"""Triton's own metrics the rules read (by the model's name in Triton)."""
SOURCE = re.compile(r"\b(?:tritonshare|nv)_[a-z_]+\b")

HOST = 'job="tritonshare-system/tritonshare-model-hosts", namespace="team-a", pod="host-a"'
NODE = 'job="tritonshare-system/tritonshare-node", namespace="tritonshare-system"'


def rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["spec"]["groups"]
    return [rule for group in groups for rule in group["rules"]]


def _base(name: str) -> str:
    return re.sub(r"_(sum|count)$", "", name)


def _rule_file(tmp_path: Path, groups: list[dict[str, Any]] | None = None) -> Path:
    path = tmp_path / "rules.yml"
    groups = groups or yaml.safe_load(RULES.read_text())["spec"]["groups"]
    path.write_text(yaml.safe_dump({"groups": groups}))
    return path


def _series(name: str, labels: str, values: str) -> dict[str, str]:
    return {"series": f"{name}{{{labels}}}", "values": values}


def _expect(name: str, labels: str, value: float) -> dict[str, Any]:
    return {"expr": name, "eval_time": "5m", "exp_samples": [{"labels": f"{name}{{{labels}}}",
                                                               "value": value}]}  # fmt: skip


def _test(rule_file: Path) -> dict[str, Any]:
    proxy = f'{HOST}, container="proxy"'
    triton = f'{NODE}, pod="node-a", container="triton"'
    agent_a = f'{NODE}, pod="node-a", container="agent"'
    agent_b = f'{NODE}, pod="node-b", container="agent"'
    info = "tritonshare_agent_model_info"
    mnist_a = (
        'model="team-a_mnist_1", model_namespace="team-a", model_pod="host-a", model_id="mnist"'
    )
    inputs = [
        # The proxy answers mnist over gRPC and HTTP: 0.5 s and 0.25 s of requests a minute.
        *(
            _series(f"tritonshare_proxy_request_duration_seconds_{part}",
                    f'{proxy}, model="mnist", protocol="{protocol}", route="infer"', values)
            for part, protocol, values in (
                ("sum", "grpc", "0+0.5x10"), ("count", "grpc", "0+10x10"),
                ("sum", "http", "0+0.25x10"), ("count", "http", "0+5x10"),
            )
        ),
        # An on-demand model woken once a minute, each wake 1.5 s.
        _series("tritonshare_proxy_wake_seconds_sum", f'{proxy}, model="sleepy"', "0+1.5x10"),
        _series("tritonshare_proxy_wake_seconds_count", f'{proxy}, model="sleepy"', "0+1x10"),
        # Triton runs mnist (its name there: team-a_mnist_1) 3 times a minute for 30 ms in all,
        # fails once a minute; a model the agent does not list is not recorded.
        _series("nv_inference_request_duration_us",
                f'{triton}, model="team-a_mnist_1", version="1"', "0+30000x10"),
        _series("nv_inference_request_success",
                f'{triton}, model="team-a_mnist_1", version="1"', "0+3x10"),
        _series("nv_inference_request_failure",
                f'{triton}, model="team-a_mnist_1", version="1"', "0+1x10"),
        _series("nv_inference_request_duration_us", f'{triton}, model="stray", version="1"',
                "0+1x10"),
        # The agent of node-a: mnist (loaded), sleepy (asleep), team-b's x (loaded); node-b
        # holds a second replica of mnist.
        _series(info, f"{agent_a}, {mnist_a}", "1x10"),
        _series(info, f'{agent_a}, model="team-a_sleepy_1", model_namespace="team-a", '
                      'model_pod="host-a", model_id="sleepy"', "1x10"),
        _series(info, f'{agent_a}, model="team-b_x_1", model_namespace="team-b", '
                      'model_pod="host-b", model_id="x"', "1x10"),
        _series(info, f'{agent_b}, model="team-a_mnist_2", model_namespace="team-a", '
                      'model_pod="host-a2", model_id="mnist"', "1x10"),
        _series("tritonshare_agent_model_residency_state",
                f'{agent_a}, model="team-a_sleepy_1", state="sleeping"', "1x10"),
        # Loads of 2 s and unloads of 1 s, one a minute; load failures of two reasons, one
        # unload failure; three evictions a minute.
        _series("tritonshare_agent_load_duration_seconds_sum", agent_a, "0+2x10"),
        _series("tritonshare_agent_load_duration_seconds_count", agent_a, "0+1x10"),
        _series("tritonshare_agent_unload_duration_seconds_sum", agent_a, "0+1x10"),
        _series("tritonshare_agent_unload_duration_seconds_count", agent_a, "0+1x10"),
        _series("tritonshare_agent_load_failures_total", f'{agent_a}, reason="triton_refused"',
                "0+1x10"),
        _series("tritonshare_agent_load_failures_total",
                f'{agent_a}, reason="triton_unreachable"', "0x10"),
        _series("tritonshare_agent_unload_failures_total", f'{agent_a}, reason="timeout"',
                "0 0 1x8"),
        _series("tritonshare_agent_evictions_total", f'{agent_a}, reason="wake"', "0+1x10"),
        _series("tritonshare_agent_evictions_total", f'{agent_a}, reason="load"', "0+2x10"),
        # node-a: two 16 GB GPUs, 1 GB and 0.6 GB measured; node-b: one 8 GB GPU, nothing
        # measured yet.
        *(
            _series("tritonshare_agent_gpu_memory_total_bytes",
                    f'{agent}, gpu="{gpu}", UUID="GPU-{gpu}{agent[-8]}", product="T4"', size)
            for agent, gpu, size in (
                (agent_a, "0", "16000000000x10"), (agent_a, "1", "16000000000x10"),
                (agent_b, "0", "8000000000x10"),
            )
        ),
        _series("tritonshare_agent_model_gpu_memory_bytes",
                f'{agent_a}, model="team-a_mnist_1", gpu="0", UUID="GPU-0a"', "1000000000x10"),
        _series("tritonshare_agent_model_gpu_memory_bytes",
                f'{agent_a}, model="team-b_x_1", gpu="1", UUID="GPU-1a"', "600000000x10"),
        _series("tritonshare_agent_models_loaded", f'{agent_a}, gpu="0", UUID="GPU-0a"', "1x10"),
        _series("tritonshare_agent_models_loaded", f'{agent_a}, gpu="1", UUID="GPU-1a"', "1x10"),
        _series("tritonshare_agent_models_loaded", f'{agent_a}, gpu="", UUID=""', "0x10"),
    ]  # fmt: skip
    per_model = f'{HOST}, container="proxy"'
    invoked = (
        'job="tritonshare-system/tritonshare-node", namespace="team-a", pod="node-a", '
        'container="triton", modelId="mnist", vModelId="mnist"'
    )
    mnist, sleepy = 'modelId="mnist", vModelId="mnist"', 'modelId="sleepy", vModelId="sleepy"'
    expected = [
        _expect("modelmesh_api_request_milliseconds_sum", f"{per_model}, {mnist}", 3750),
        _expect("modelmesh_api_request_milliseconds_count", f"{per_model}, {mnist}", 75),
        _expect("modelmesh_invoke_model_milliseconds_sum", invoked, 150),
        _expect("modelmesh_invoke_model_milliseconds_count", invoked, 20),
        _expect("modelmesh_cache_miss_milliseconds_sum", f"{per_model}, {sleepy}", 7500),
        _expect("modelmesh_cache_miss_milliseconds_count", f"{per_model}, {sleepy}", 5),
        _expect("modelmesh_loadmodel_milliseconds_sum", agent_a, 10000),
        _expect("modelmesh_loadmodel_milliseconds_count", agent_a, 5),
        _expect("modelmesh_unloadmodel_milliseconds_sum", agent_a, 5000),
        _expect("modelmesh_unloadmodel_milliseconds_count", agent_a, 5),
        _expect("modelmesh_loadmodel_failure", agent_a, 5),
        _expect("modelmesh_unloadmodel_failure", agent_a, 1),
        _expect("modelmesh_age_at_eviction_milliseconds_count", agent_a, 15),
        _expect("modelmesh_instance_models_total", agent_a, 2),
        {
            "expr": "modelmesh_instance_capacity_bytes",
            "eval_time": "5m",
            "exp_samples": [
                {"labels": f"modelmesh_instance_capacity_bytes{{{agent_a}}}", "value": 32e9},
                {"labels": f"modelmesh_instance_capacity_bytes{{{agent_b}}}", "value": 8e9},
            ],
        },
        {
            "expr": "modelmesh_instance_used_bytes",
            "eval_time": "5m",
            "exp_samples": [
                {"labels": f"modelmesh_instance_used_bytes{{{agent_a}}}", "value": 1.6e9},
                {"labels": f"modelmesh_instance_used_bytes{{{agent_b}}}", "value": 0},
            ],
        },
        {
            "expr": "modelmesh_instance_used_bps",
            "eval_time": "5m",
            "exp_samples": [
                {"labels": f"modelmesh_instance_used_bps{{{agent_a}}}", "value": 500},
                {"labels": f"modelmesh_instance_used_bps{{{agent_b}}}", "value": 0},
            ],
        },
        {
            # mnist counted once for its two replicas; sleepy asleep has no copy loaded.
            "expr": "modelmesh_models_loaded_total",
            "eval_time": "5m",
            "exp_samples": [
                {"labels": 'modelmesh_models_loaded_total{namespace="team-a"}', "value": 1},
                {"labels": 'modelmesh_models_loaded_total{namespace="team-b"}', "value": 1},
            ],
        },
    ]
    return {
        "rule_files": [str(rule_file)],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": inputs, "promql_expr_test": expected}],
    }


def _promtool_test(tmp_path: Path, rule_file: Path) -> subprocess.CompletedProcess[str]:
    promtool = require_executable("promtool")
    test_file = tmp_path / "modelmesh_test.yml"
    test_file.write_text(yaml.safe_dump(_test(rule_file)))
    return subprocess.run(
        [promtool, "test", "rules", str(test_file)], capture_output=True, text=True, timeout=60
    )


def test_the_rules_are_valid_prometheus_rules(tmp_path: Path) -> None:
    promtool = require_executable("promtool")
    result = subprocess.run(
        [promtool, "check", "rules", str(_rule_file(tmp_path))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, f"promtool rejects the rules:\n{result.stdout}{result.stderr}"


def test_each_rule_records_modelmesh_s_name_in_its_units_and_labels(tmp_path: Path) -> None:
    result = _promtool_test(tmp_path, _rule_file(tmp_path))
    assert result.returncode == 0, f"promtool test rules:\n{result.stdout}{result.stderr}"
    tested = {e["expr"] for e in _test(tmp_path / "x")["tests"][0]["promql_expr_test"]}
    assert tested == {r["record"] for r in rules()}, "each recorded name has its expectation"


@pytest.mark.parametrize("record", sorted({r["record"] for r in rules()}))
def test_a_rule_that_lost_its_units_or_labels_fails_its_test(tmp_path: Path, record: str) -> None:
    """The test can fail: with one rule's value doubled, it does."""
    groups = yaml.safe_load(RULES.read_text())["spec"]["groups"]
    for rule in groups[0]["rules"]:
        if rule["record"] == record:
            rule["expr"] = f"2 * ({rule['expr']})"
    result = _promtool_test(tmp_path, _rule_file(tmp_path, groups))
    assert result.returncode != 0, f"{record} doubled still passes"


def test_the_rules_read_only_what_the_parts_and_triton_export() -> None:
    agent = AgentMetrics()
    agent.watch_residency(dict)  # the on-demand models' states
    exported = exported_families() | TRITON | {f.name for f in agent.registry.collect()}
    for rule in rules():
        for name in SOURCE.findall(rule["expr"]):
            family = re.sub(r"_(sum|count)$", "", name)
            assert name in exported or family in exported, f"{rule['record']} reads {name}"


def test_the_docs_say_for_every_modelmesh_name_what_serves_it_or_why_nothing_does() -> None:
    doc = DOC.read_text()
    recorded = {_base(r["record"]) for r in rules()}
    assert recorded <= set(MODELMESH), recorded - set(MODELMESH)
    for name in MODELMESH:
        assert f"`{name}" in doc, f"docs/modelmesh.md does not say what serves {name}"
