"""Parsing a model's `config.pbtxt` and checking the name it gives against the model id.

The loader checks the config before sending a model and the agent checks it again before
installing one, so both parse with the same rules: tritonclient's ModelConfig message read by
protobuf's text format, and a `name`, when set, equal to the model id (Triton refuses a load
otherwise). Pure: it takes text and returns the parsed message or raises ModelConfigError. It must
not read files or add a part's advice; each part wraps the error into its own type at its edge.
"""

from __future__ import annotations

from typing import Any, TypeAlias

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

# tritonclient ships no type stubs: the generated message class is untyped here.
ModelConfig: TypeAlias = Any


class ModelConfigError(ValueError):
    """config.pbtxt cannot be served under the model id; the message says why."""

    def __init__(self, message: str, *, config_name: str | None = None) -> None:
        super().__init__(message)
        self.config_name = config_name
        """The name config.pbtxt gives, when a name other than the model id is the problem."""

    def advised(self, *, wrong_name: str, invalid: str) -> str:
        """The message followed by the part's advice for this kind of problem."""
        return f"{self}; {wrong_name if self.config_name is not None else invalid}"


def parse_model_config(text: str, model_id: str, source: str = "config.pbtxt") -> ModelConfig:
    """Parse config.pbtxt text; `source` names it in errors (a path, or "config.pbtxt")."""
    config = model_config_pb2.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as e:
        raise ModelConfigError(f"{source} is not a valid Triton model configuration: {e}") from e
    if config.name and config.name != model_id:
        raise ModelConfigError(
            f"{source} names the model {config.name!r} but the model id is {model_id!r}",
            config_name=config.name,
        )
    return config


def model_config_text(config: ModelConfig) -> str:
    """`config` as config.pbtxt text (protobuf's text format)."""
    return str(text_format.MessageToString(config))


def calls_may_run_twice(config: dict[str, Any]) -> bool:
    """Whether a call of the model whose config is `config` (Triton's JSON, as
    `GET /v2/models/NAME/config` answers it) may be sent again after it was lost in flight,
    when the model says neither way (`idempotent` unset): not with a sequence batcher (each call
    changes its sequence's state), not decoupled (some of its answers may have reached the
    client), not an ensemble (its steps' configs are not in its own)."""
    policy = config.get("model_transaction_policy")
    decoupled = isinstance(policy, dict) and policy.get("decoupled") is True
    return not (
        decoupled
        or config.get("sequence_batching") is not None
        or config.get("ensemble_scheduling") is not None
        or config.get("platform") == "ensemble"
    )
