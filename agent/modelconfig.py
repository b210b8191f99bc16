"""A model's `config.pbtxt` as the agent needs it: the backend check and the load-time override.

Triton accepts a `config` parameter on `POST /v2/repository/models/<name>/load`: a JSON ModelConfig
that replaces `config.pbtxt` for that load. The agent uses it to pin every instance group to the
GPU the binder chose (`KIND_GPU`, `gpus: [cuda index]`), or to the CPU on machines without GPUs.
Parsing and the name check are shared with the loader (`common.modelconfig`); this module turns
their error into the agent's. Pure: it reads the text it is given and returns strings; the files
are `agent.repository`'s.
"""

from __future__ import annotations

from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2

from agent.errors import InvalidRequestError
from common.modelconfig import ModelConfig, ModelConfigError, parse_model_config

_RENAME = "Triton would refuse to load it: make them equal"


def parse_config(text: str, model_id: str) -> ModelConfig:
    """Parse `config.pbtxt` text; its `name`, when set, must equal the model id."""
    try:
        config = parse_model_config(text, model_id)
    except ModelConfigError as e:
        fix = f"model {model_id!r} cannot be installed until it is fixed"
        raise InvalidRequestError(e.advised(wrong_name=_RENAME, invalid=fix)) from e
    if not config.backend and not config.platform:
        raise InvalidRequestError(
            f"config.pbtxt of model {model_id!r} sets neither 'backend' nor 'platform'; "
            f'Triton cannot tell how to run it without one (for example backend: "python")'
        )
    return config


def pinned_config(config: ModelConfig, model_id: str, gpu_index: int | None) -> ModelConfig:
    """A copy whose instance groups run on GPU `gpu_index`, or on the CPU when it is None.

    A config without instance groups gets one group of one instance, as Triton's default would
    place one per visible GPU, which is exactly what sharing must prevent.
    """
    pinned = model_config_pb2.ModelConfig()
    pinned.CopyFrom(config)
    pinned.name = model_id
    if not pinned.instance_group:
        pinned.instance_group.add(count=1)
    kind = (
        model_config_pb2.ModelInstanceGroup.KIND_CPU
        if gpu_index is None
        else model_config_pb2.ModelInstanceGroup.KIND_GPU
    )
    for group in pinned.instance_group:
        group.kind = kind
        del group.gpus[:]
        if gpu_index is not None:
            group.gpus.append(gpu_index)
        if group.count < 1:
            group.count = 1
    return pinned


def override_json(config: ModelConfig) -> str:
    """The JSON string Triton's load `config` parameter takes."""
    return json_format.MessageToJson(
        config, preserving_proto_field_name=True, indent=None, sort_keys=True
    )
