"""The hosted-models annotation: written by the binder, read by the agent and the host's loader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common.contract import Keys
from common.hosted import (
    HostedError,
    HostedReplica,
    decode_hosted,
    encode_hosted,
    loaded_condition,
    serves_label,
)
from proxy.table import TableError, read_models

KEYS = Keys()


def test_round_trip_keeps_every_field_in_a_stable_order() -> None:
    b = HostedReplica("b", "uid-b", 1, "GPU-1", "on-demand", "p1", "https://x/b.tgz", 4, 60, True)
    a = HostedReplica(
        "a",
        "uid-a",
        0,
        "GPU-0",
        "always",
        "p0",
        "s3://models/a",
        storage_secret="a-creds",
        storage_options=(
            ("s3-endpoint", "minio.data:9000"),
            ("s3-usehttps", "0"),
            ("schema-path", "onnx/schema.json"),
        ),
        idempotent=True,
    )
    value = encode_hosted([b, a])
    assert value.index('"model":"a"') < value.index('"model":"b"')
    assert decode_hosted(value) == [a, b]
    assert a.replica_uid == "uid-a/0" and b.replica_name == "b/1"


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("{", "not JSON"),
        ('{"model": "a"}', "not a JSON list"),
        ('["a"]', "entry 1 of the hosted-models annotation is not an object"),
        ('[{"uid": "u", "replica": 0}]', "entry 1"),
        ('[{"model": "a", "uid": "u", "replica": -1}]', "`replica`"),
        ('[{"model": "a", "uid": "u", "replica": 0, "residency": "sometimes"}]', "residency"),
        ('[{"model": "a", "uid": "u", "replica": 0, "maxConcurrency": "4"}]', "maxConcurrency"),
        ('[{"model": "a", "uid": "u", "replica": 0, "storageSecret": "b/c"}]', "Secret name"),
        ('[{"model": "a", "uid": "u", "replica": 0, "storageOptions": []}]', "storageOptions"),
        (
            '[{"model": "a", "uid": "u", "replica": 0, "storageOptions": {"s3-endpoint": "a b"}}]',
            "s3-endpoint='a b' is not a host",
        ),
        (
            '[{"model": "a", "uid": "u", "replica": 0, "storageOptions": {"schema-path": "../x"}}]',
            "not the path of a file in the model's bucket",
        ),
    ],
)
def test_a_malformed_annotation_says_what_is_wrong(value: str, says: str) -> None:
    with pytest.raises(HostedError, match=says):
        decode_hosted(value)


def test_a_replica_carries_the_model_id_its_clients_send_when_it_is_not_the_name() -> None:
    named = HostedReplica("resnet-50", "u", 0, "GPU-0", "always", "p", model_id="resnet_50")
    plain = HostedReplica("add-one", "v", 0, "GPU-0", "always", "p")
    value = encode_hosted([named, plain])
    assert value.count('"modelId"') == 1 and '"modelId":"resnet_50"' in value
    assert [(r.model, r.model_id) for r in decode_hosted(value)] == [
        ("add-one", "add-one"),
        ("resnet-50", "resnet_50"),
    ]
    with pytest.raises(HostedError, match=r"entry 1 .* starts with a dot"):
        decode_hosted('[{"model": "a", "uid": "u", "replica": 0, "modelId": ".hidden"}]')


def test_an_empty_annotation_is_no_replica() -> None:
    assert decode_hosted("") == []


def test_names_fit_a_label_and_condition_name_part() -> None:
    assert serves_label(KEYS, "resnet") == "tritonshare.io/serves-resnet"
    assert loaded_condition(KEYS, "resnet", 2) == "tritonshare.io/loaded-resnet_2"
    long = "m" * 128
    for name in (serves_label(KEYS, long), loaded_condition(KEYS, long, 9)):
        part = name.removeprefix("tritonshare.io/")
        assert len(part) <= 63 and part[-1].isalnum()
    assert serves_label(KEYS, long) != serves_label(KEYS, long[:-1] + "n")


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"maxConcurrency": -1}, "`maxConcurrency` -1 is not a whole number of 0 or more"),
        ({"idleSeconds": True}, "`idleSeconds` True is not a whole number of 0 or more"),
        ({"residency": "lazy"}, "`residency` 'lazy' is not one of always, on-demand"),
        ({"residency": 1}, "`residency` 1 is not one of always, on-demand"),
        ({"idempotent": "yes"}, "`idempotent` 'yes' is not true or false"),
    ],
)
def test_a_host_s_two_lists_refuse_a_model_s_settings_alike(
    fields: dict[str, object], says: str, tmp_path: Path
) -> None:
    """The binder's hosted-models entries and the loader's models file (the proxy's table) give a
    model's limit, idle time and residency with one meaning: one parser, one refusal."""
    with pytest.raises(HostedError, match=says):
        decode_hosted(json.dumps([{"model": "a", "uid": "u", "replica": 0, **fields}]))
    models = tmp_path / "models.json"
    models.write_text(json.dumps([{"model": "a", **fields}]))
    with pytest.raises(TableError, match=says):
        read_models(models)
