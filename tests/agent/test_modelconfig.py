"""config.pbtxt parsing and the load-time override that pins instances."""

from __future__ import annotations

import json

import pytest

from agent.errors import InvalidRequestError
from agent.modelconfig import override_json, parse_config, pinned_config
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
