"""The hosted-models annotation: written by the binder, read by the agent and the host's loader."""

from __future__ import annotations

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
        storage_options=(("s3-endpoint", "minio.data:9000"), ("s3-usehttps", "0")),
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
    ],
)
def test_a_malformed_annotation_says_what_is_wrong(value: str, says: str) -> None:
    with pytest.raises(HostedError, match=says):
        decode_hosted(value)


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
