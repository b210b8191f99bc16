"""The contract's names follow the prefix; the proof of concept's prefix gives its exact names."""

from __future__ import annotations

import pytest

from common.contract import (
    POC_PREFIX,
    ContractError,
    Keys,
    agent_lease_name,
    is_valid_model_id,
    parse_overcommit,
    validate_model_id,
    validate_residency,
)


def test_default_keys() -> None:
    keys = Keys()
    assert keys.gpu_mem == "tritonshare.io/gpu-mem"
    assert keys.model_id == "tritonshare.io/model-id"
    assert keys.gpu == "tritonshare.io/gpu"
    assert keys.gpu_mem_total == "tritonshare.io/gpu-mem-total"
    assert keys.gpus == "tritonshare.io/gpus"
    assert keys.residency == "tritonshare.io/residency"
    assert keys.gpu_mem_overcommit == "tritonshare.io/gpu-mem-overcommit"


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


def test_residency_classes_and_what_a_bad_one_is_told() -> None:
    assert validate_residency("always", "k") == "always"
    assert validate_residency("on-demand", "k") == "on-demand"
    with pytest.raises(ContractError) as e:
        validate_residency("OnDemand", "tritonshare.io/residency")
    assert str(e.value) == (
        "annotation tritonshare.io/residency='OnDemand' is not a residency class; write "
        "tritonshare.io/residency: always (loaded while the pod lives, the default) or "
        "tritonshare.io/residency: on-demand (unloaded when idle, loaded again by the next request)"
    )


@pytest.mark.parametrize(("value", "factor"), [("1", 1.0), ("2.5", 2.5), ("100", 100.0)])
def test_overcommit_factors(value: str, factor: float) -> None:
    assert parse_overcommit(value, "k") == factor


@pytest.mark.parametrize("value", ["0", "0.99", "101", "nan", "inf", "-3", "three", ""])
def test_a_bad_overcommit_factor_says_what_to_write(value: str) -> None:
    with pytest.raises(ContractError, match=r"write a number from 1 \(no over-commit\) to 100"):
        parse_overcommit(value, "tritonshare.io/gpu-mem-overcommit")
