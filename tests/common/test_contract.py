"""The contract's names follow the prefix; the proof of concept's prefix gives its exact names."""

from __future__ import annotations

import pytest

from common.contract import (
    POC_PREFIX,
    ContractError,
    Keys,
    agent_lease_name,
    is_valid_model_id,
    validate_model_id,
)


def test_default_keys() -> None:
    keys = Keys()
    assert keys.gpu_mem == "tritonshare.io/gpu-mem"
    assert keys.model_id == "tritonshare.io/model-id"
    assert keys.gpu == "tritonshare.io/gpu"
    assert keys.gpu_mem_total == "tritonshare.io/gpu-mem-total"
    assert keys.gpus == "tritonshare.io/gpus"


def test_proof_of_concept_prefix_gives_its_exact_names() -> None:
    keys = Keys(POC_PREFIX)
    assert keys.gpu_mem == "seldon.io/trtis-gpu-mem"
    assert keys.model_id == "seldon.io/trtis-model-id"
    assert keys.gpu_mem_total == "seldon.io/trtis-gpu-mem-total"


@pytest.mark.parametrize("prefix", ["", "Not A Prefix/", "a//", "UPPER.io/"])
def test_bad_prefix_is_refused(prefix: str) -> None:
    with pytest.raises(ContractError, match="prefix"):
        Keys(prefix)


def test_lease_name() -> None:
    assert agent_lease_name("gpu-node-1") == "tritonshare-agent-gpu-node-1"


@pytest.mark.parametrize("model_id", ["resnet50", "a", "bert.base-v2_1", "x" * 128, "A.B"])
def test_valid_model_ids(model_id: str) -> None:
    assert validate_model_id(model_id) == model_id
    assert is_valid_model_id(model_id)


@pytest.mark.parametrize(
    ("model_id", "why"),
    [
        ("", "empty"),
        (".hidden", "dot"),
        ("x" * 129, "128"),
        ("has/slash", "characters"),
        ("spa ce", "characters"),
        ("ünï", "characters"),
        ("..", "dot"),
    ],
)
def test_invalid_model_ids_say_why(model_id: str, why: str) -> None:
    with pytest.raises(ContractError, match=why):
        validate_model_id(model_id)
    assert not is_valid_model_id(model_id)
