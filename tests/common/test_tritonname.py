"""The private Triton name of a pod's model: deterministic, within the grammar, never shared."""

from __future__ import annotations

import re

import pytest

from common.contract import ContractError, is_valid_model_id
from common.tritonname import DIGEST_HEX, private_triton_name

UID = "3f2a6c1e-0d4b-4e8a-9c1f-2b7d5e6a8c90"


def test_the_name_is_the_model_id_a_dash_and_a_digest_and_is_stable() -> None:
    name = private_triton_name("team-a", "resnet50", UID)
    assert re.fullmatch(rf"resnet50-[0-9a-f]{{{DIGEST_HEX}}}", name), name
    assert private_triton_name("team-a", "resnet50", UID) == name
    assert is_valid_model_id(name)


def test_each_input_changes_the_name() -> None:
    base = private_triton_name("team-a", "resnet50", UID)
    others = {
        private_triton_name("team-b", "resnet50", UID),
        private_triton_name("team-a", "resnet51", UID),
        private_triton_name("team-a", "resnet50", UID[:-1] + "1"),
    }
    assert base not in others and len(others) == 3


def test_inputs_cannot_be_shifted_across_their_boundaries() -> None:
    # Without lengths, ("ab", "c", uid) and ("a", "bc", uid) would hash the same bytes.
    assert (
        private_triton_name("team-ab", "c", UID)[-DIGEST_HEX:]
        != (private_triton_name("team-a", "bc", UID)[-DIGEST_HEX:])
    )


def test_a_model_id_that_is_another_pods_private_name_gets_a_name_of_its_own() -> None:
    victim = private_triton_name("team-b", "resnet50", UID)
    attacker = private_triton_name("team-a", victim, "11111111-2222-3333-4444-555555555555")
    assert attacker != victim
    assert private_triton_name("team-b", victim, UID) != victim
    assert len(attacker) <= 128 and is_valid_model_id(attacker)


@pytest.mark.parametrize("length", [1, 103, 104, 128])
def test_long_model_ids_are_cut_so_the_name_keeps_the_grammar(length: int) -> None:
    model_id = "m" * length
    name = private_triton_name("ns", model_id, UID)
    assert len(name) == min(length, 103) + 1 + DIGEST_HEX <= 128
    assert is_valid_model_id(name)


def test_an_invalid_model_id_or_a_missing_namespace_or_uid_is_refused() -> None:
    with pytest.raises(ContractError):
        private_triton_name("ns", ".hidden", UID)
    with pytest.raises(ContractError):
        private_triton_name("ns", "a/b", UID)
    with pytest.raises(ValueError, match="namespace and uid"):
        private_triton_name("", "m", UID)
    with pytest.raises(ValueError, match="namespace and uid"):
        private_triton_name("ns", "m", "")
