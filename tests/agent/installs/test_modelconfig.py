"""config.pbtxt parsing and the load-time override that pins instances."""

from __future__ import annotations

import json

import pytest

from agent.errors import InvalidRequestError
from agent.installs.modelconfig import (
    ModelPolicy,
    arena_released,
    override_json,
    parse_config,
    pinned_config,
    selected_versions,
)
from tests.conftest import MODELS_DIR

ADD_ONE = (MODELS_DIR / "add_one" / "config.pbtxt").read_text()


def test_gpu_pinning_overrides_every_instance_group() -> None:
    config = parse_config(
        'name: "m" backend: "python" instance_group [ { kind: KIND_CPU count: 2 },'
        " { kind: KIND_GPU gpus: [0, 1] } ]",
        "m",
    )
    pinned = json.loads(override_json(pinned_config(config, "m", 3)))
    assert pinned["instance_group"] == [
        {"count": 2, "gpus": [3], "kind": "KIND_GPU"},
        {"count": 1, "gpus": [3], "kind": "KIND_GPU"},
    ]
    assert pinned["name"] == "m"


def test_cpu_pinning_and_a_config_without_groups() -> None:
    config = parse_config('backend: "python"', "m")
    pinned = json.loads(override_json(pinned_config(config, "m", None)))
    assert pinned["instance_group"] == [{"count": 1, "kind": "KIND_CPU"}]
    assert pinned["name"] == "m", "Triton needs the name in the override"


def test_an_onnx_runtime_model_is_loaded_without_a_cpu_memory_arena() -> None:
    """ONNX Runtime's arena keeps a request's peak inside Triton's process, billed to no model:
    the override turns it off (and drops a shrinkage that names it, which would fail every
    request without one); other backends' configs are left as they are."""
    for head in ('platform: "onnxruntime_onnx"', 'backend: "onnxruntime"'):
        config = parse_config(
            f'{head} parameters {{ key: "enable_mem_arena" value: {{ string_value: "1" }} }}'
            ' parameters { key: "memory.enable_memory_arena_shrinkage"'
            ' value: { string_value: "cpu:0" } }'
            ' parameters { key: "intra_op_thread_count" value: { string_value: "1" } }',
            "m",
        )
        loaded = json.loads(override_json(arena_released(pinned_config(config, "m", None))))
        assert loaded["parameters"] == {
            "enable_mem_arena": {"string_value": "0"},
            "intra_op_thread_count": {"string_value": "1"},
        }
        assert config.parameters["enable_mem_arena"].string_value == "1", "a copy"
    python = parse_config(ADD_ONE, "add_one")
    assert arena_released(python) is python


def test_the_shipped_model_keeps_its_inputs_in_the_override() -> None:
    pinned = json.loads(
        override_json(pinned_config(parse_config(ADD_ONE, "add_one"), "add_one", 0))
    )
    assert pinned["input"][0]["name"] == "INPUT0"
    assert pinned["max_batch_size"] == 8


def test_a_config_naming_another_model_is_refused() -> None:
    with pytest.raises(InvalidRequestError, match="names the model 'add_one'"):
        parse_config(ADD_ONE, "other")


def test_unparsable_and_backendless_configs_are_refused() -> None:
    with pytest.raises(InvalidRequestError, match="not a valid Triton model configuration"):
        parse_config("name: ", "m")
    with pytest.raises(InvalidRequestError, match="neither 'backend' nor 'platform'"):
        parse_config('name: "m"', "m")


@pytest.mark.parametrize(
    ("policy", "present", "loaded"),
    [
        ("", [1, 2, 3], 1),  # Triton's default: the latest version
        ("version_policy { latest { num_versions: 2 } }", [1, 2, 3], 2),
        ("version_policy { latest { num_versions: 5 } }", [1, 2, 3], 3),
        ("version_policy { all {} }", [1, 2, 3], 3),
        ("version_policy { specific { versions: [2, 7] } }", [1, 2, 3], 1),
        ("version_policy { specific { versions: [1, 3] } }", [1, 2, 3], 2),
        ("version_policy { all {} }", [], 1),
    ],
)
def test_the_versions_a_policy_selects_are_those_present(
    policy: str, present: list[int], loaded: int
) -> None:
    config = parse_config(f'backend: "onnxruntime" {policy}', "m")
    assert selected_versions(config, present) == loaded


def test_every_bound_counts_once_per_selected_version() -> None:
    config = parse_config(
        'backend: "onnxruntime" instance_group [ { count: 4 } ] '
        'model_warmup [ { name: "w" batch_size: 1 count: 20 inputs { key: "x" value: { '
        "data_type: TYPE_FP32 dims: [ 256 ] zero_data: true } } } ] "
        "version_policy { all {} }",
        "m",
    )
    policy = ModelPolicy(max_instances=8, max_load_data_bytes=2048)
    assert policy.load_problems(config, 2) == []
    # 60 warmup runs stay within 64 per load.
    assert policy.load_problems(config, 3) == [
        "12 instances (3 versions selected by version_policy), over this node's 8 per model "
        "(--max-model-instances)",
        "3072 bytes of warmup samples (every input times its batch size) and initial sequence "
        "states (3 versions selected by version_policy), over this node's 2048 "
        "(--max-load-data-bytes)",
    ]
    policy.check_config(config, "m", "ns", [1, 2])
    with pytest.raises(InvalidRequestError, match="12 instances"):
        policy.check_config(config, "m", "ns", [1, 2, 3])
