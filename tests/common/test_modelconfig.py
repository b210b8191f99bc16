"""Parsing config.pbtxt and checking its name, as both the loader and the agent do."""

from __future__ import annotations

import pytest
from google.protobuf import json_format

from common.modelconfig import ModelConfigError, calls_may_run_twice, parse_model_config
from tests.conftest import MODELS_DIR

ADD_ONE = (MODELS_DIR / "add_one" / "config.pbtxt").read_text()


def test_a_real_config_parses_into_triton_s_message() -> None:
    config = parse_model_config(ADD_ONE, "add_one")
    assert config.name == "add_one"
    assert config.max_batch_size == 8
    assert [i.name for i in config.input] == ["INPUT0"]


def test_a_config_without_a_name_takes_any_model_id() -> None:
    assert parse_model_config('backend: "python"', "whatever").backend == "python"


def test_a_name_other_than_the_model_id_is_refused_and_named() -> None:
    with pytest.raises(ModelConfigError) as e:
        parse_model_config(ADD_ONE, "other", source="/models/x/config.pbtxt")
    assert str(e.value) == (
        "/models/x/config.pbtxt names the model 'add_one' but the model id is 'other'"
    )
    assert e.value.config_name == "add_one"
    assert e.value.advised(wrong_name="rename it", invalid="fix it").endswith("'other'; rename it")
    assert isinstance(e.value, ValueError)


def test_a_syntax_error_names_the_source_and_the_line() -> None:
    with pytest.raises(ModelConfigError, match=r"^config\.pbtxt is not a valid Triton .*: 2:") as e:
        parse_model_config('backend: "python"\nmax_batch_size: x\n', "m")
    assert e.value.config_name is None
    assert e.value.advised(wrong_name="rename it", invalid="fix it").endswith("; fix it")
    with pytest.raises(ModelConfigError, match="batch_size"):
        parse_model_config("batch_size: 4\n", "m")


@pytest.mark.parametrize(
    ("extra", "twice"),
    [
        ("", True),
        ("model_transaction_policy { decoupled: false }", True),
        ("sequence_batching { }", False),
        ("sequence_batching { oldest { max_candidate_sequences: 4 } }", False),
        ("model_transaction_policy { decoupled: true }", False),
        ('platform: "ensemble" ensemble_scheduling { step [ ] }', False),
    ],
)
def test_a_model_whose_config_is_stateful_or_streams_never_has_a_call_run_twice(
    extra: str, twice: bool
) -> None:
    """As Triton answers `GET /v2/models/NAME/config`: its fields by their proto names."""
    text = f'name: "m" backend: "python" max_batch_size: 0 {extra}'
    config = json_format.MessageToDict(
        parse_model_config(text, "m"), preserving_proto_field_name=True
    )
    assert calls_may_run_twice(config) is twice
