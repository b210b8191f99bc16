"""The external-data locations an ONNX model names, found wherever a tensor can be, and the rule
that only the model's own files may be named. The protobuf is written by hand here, field by
field, as onnx.save_model writes it (tests/agent/test_attacks.py installs such a model)."""

from __future__ import annotations

import tracemalloc

import pytest

from agent.installs.modelconfig import external_data_problem
from agent.installs.onnxmodel import OnnxFormatError, external_locations


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def field(number: int, payload: bytes | int) -> bytes:
    if isinstance(payload, int):
        return varint(number << 3) + varint(payload)
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def external_tensor(location: str, name: str = "w") -> bytes:
    """A TensorProto whose data is in `location`."""
    entry = field(1, b"location") + field(2, location.encode())
    return field(1, 4) + field(8, name.encode()) + field(13, entry) + field(14, 1)


def model(graph: bytes, *extra: bytes) -> bytes:
    return field(1, 8) + field(7, graph) + b"".join(extra)


def onnx_model(*locations: str) -> bytes:
    """A model naming `locations` as external data of its initializers."""
    return model(b"".join(field(5, external_tensor(loc)) for loc in locations))


def test_every_place_a_tensor_can_be_is_searched() -> None:
    inline = field(1, 1) + field(8, b"inline") + field(9, b"\x00" * 64)  # raw_data: skipped
    attribute = field(1, b"value") + field(5, external_tensor("in-attribute"))
    subgraph = field(5, external_tensor("in-subgraph"))
    branch = field(1, b"then_branch") + field(6, subgraph)
    node = field(4, b"If") + field(5, attribute) + field(5, branch)
    sparse = field(1, external_tensor("sparse-values")) + field(2, external_tensor("indices"))
    graph = (
        field(1, node) + field(5, inline) + field(5, external_tensor("init")) + field(15, sparse)
    )
    function = field(1, b"f") + field(7, field(4, b"Constant") + field(5, attribute))
    training = field(1, field(5, external_tensor("training")))
    found = list(external_locations(model(graph, field(20, training), field(25, function))))
    assert sorted(found) == sorted(
        [
            "in-attribute",
            "in-subgraph",
            "init",
            "sparse-values",
            "indices",
            "in-attribute",
            "training",
        ]
    )


def test_a_model_without_external_data_names_nothing() -> None:
    tensor = field(1, 1) + field(8, b"w") + field(9, b"\x01\x02")
    assert list(external_locations(model(field(5, tensor)))) == []


@pytest.mark.parametrize(
    "data",
    [b"onnx", field(7, b"\x0a\x05ab"), b"\x3a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"],
    ids=["text", "truncated", "endless-number"],
)
def test_what_is_not_an_onnx_protobuf_is_refused(data: bytes) -> None:
    with pytest.raises(OnnxFormatError):
        list(external_locations(data))


FILES = {"config.pbtxt", "1/model.onnx", "1/weights.bin", "1/data/more.bin"}


@pytest.mark.parametrize("location", ["weights.bin", "data/more.bin", "./weights.bin"])
def test_files_of_the_model_may_hold_its_tensors(location: str) -> None:
    assert external_data_problem("m", "1/model.onnx", location, FILES) == ""


@pytest.mark.parametrize(
    "location",
    [
        "/proc/self/environ",
        "../../victim/1/model.onnx",
        "data/../../config.pbtxt",
        "..\\..\\victim",
        "missing.bin",
        "",
        "*/_ORT_MEM_ADDR_/*",
    ],
)
def test_anything_else_is_refused_with_what_to_do(location: str) -> None:
    problem = external_data_problem("m", "1/model.onnx", location, FILES)
    assert "is not a file of the model" in problem
    assert "install it with the model" in problem


def test_a_file_of_tiny_fields_costs_a_bounded_walk(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model crafted of millions of tiny fields would hold the install's thread for minutes:
    the walk stops at a bound and says so."""
    monkeypatch.setattr("agent.installs.onnxmodel.MAX_FIELDS", 1000)
    graph = field(99, 1) * 1001
    with pytest.raises(OnnxFormatError, match="more than 1000 fields"):
        list(external_locations(model(graph)))
    assert list(external_locations(model(field(99, 1) * 990))) == []


def test_a_location_longer_than_any_path_is_refused_before_it_is_read() -> None:
    with pytest.raises(OnnxFormatError, match="longer than any path"):
        list(external_locations(onnx_model("a" * 5000)))


def test_a_graph_of_millions_of_nodes_is_walked_in_constant_memory() -> None:
    """The walk keeps one field iterator per open message, not every message it has yet to
    enter: a wide graph costs no more memory than a narrow one."""
    wide = model(field(1, field(4, b"Relu")) * 200_000)
    tracemalloc.start()
    try:
        list(external_locations(wide))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1024 * 1024, peak
