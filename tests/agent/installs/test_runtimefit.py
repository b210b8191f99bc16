"""The ONNX header the agent reads before an install: the IR version and opsets of models that
onnx.helper builds, read from a few hundred bytes of the file whatever its size; a truncated,
garbled or oversized file refused cleanly; and the refusal of a model newer than the node's ONNX
Runtime reads, with the export that it reads."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from agent.installs.onnxmodel import OnnxFormatError
from agent.installs.runtimefit import (
    MAX_OPSET_BYTES,
    MAX_TOP_FIELDS,
    OnnxHeader,
    onnx_file_problem,
    onnx_release_problem,
    read_onnx_header,
)
from agent.models.install import onnx_problem
from common.tritonrelease import PINNED, RELEASES
from sim.onnxmodels import conv_model
from tests.agent.installs.test_onnxmodel import field, varint


class CountingFile(io.BytesIO):
    """A file that counts the bytes read from it."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.bytes_read = 0

    def read(self, size: int | None = -1, /) -> bytes:
        data = super().read(size)
        self.bytes_read += len(data)
        return data


def built(
    ir_version: int | None = None, opsets: dict[str, int] | None = None, mib: int = 0
) -> bytes:
    """A model as onnx.helper builds it: its defaults, or the IR version and opsets given, with an
    initializer of `mib` MiB."""
    weights = numpy_helper.from_array(np.zeros(mib * 262144, np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        [weights],
    )
    keywords = {}
    if opsets is not None:
        keywords["opset_imports"] = [helper.make_opsetid(d, v) for d, v in opsets.items()]
    model = helper.make_model(graph, **keywords)
    if ir_version is not None:
        model.ir_version = ir_version
    return model.SerializeToString()


@pytest.mark.parametrize(
    ("ir_version", "opsets"),
    [
        (None, None),
        (3, {"": 8}),
        (8, {"": 13}),
        (10, {"": 21, "ai.onnx.ml": 4}),
        (10, {"ai.onnx": 17}),
        (12, {"": 24, "com.microsoft": 1}),
    ],
    ids=["defaults", "ir3", "ir8", "ir10-ml", "ai.onnx", "ir12-custom"],
)
def test_models_onnx_helper_builds_are_read_as_onnx_reads_them(
    ir_version: int | None, opsets: dict[str, int] | None
) -> None:
    data = built(ir_version, opsets)
    model = onnx.load_from_string(data)
    header = read_onnx_header(io.BytesIO(data))
    assert header.ir_version == model.ir_version
    assert dict(header.opsets) == {o.domain: o.version for o in model.opset_import}
    assert header.default_opset == max(
        o.version for o in model.opset_import if o.domain in ("", "ai.onnx")
    )


def test_onnx_s_defaults_are_newer_than_the_pinned_release_reads() -> None:
    """What a user gets without asking: this onnx's IR and opset, over ONNX Runtime 1.19's."""
    header = read_onnx_header(io.BytesIO(built()))
    assert header.ir_version == onnx.IR_VERSION > PINNED.onnx_max_ir
    assert header.default_opset == onnx.defs.onnx_opset_version() > PINNED.onnx_max_opset


def test_a_large_model_costs_a_few_hundred_bytes_read() -> None:
    """The graph (weights included) comes before the opsets in the file: it is stepped over."""
    data = built(8, {"": 13}, mib=32)
    file = CountingFile(data)
    assert read_onnx_header(file) == OnnxHeader(8, {"": 13})
    assert len(data) > 32 * 1024 * 1024 and file.bytes_read < 512


def test_a_file_without_a_version_reads_as_none() -> None:
    assert read_onnx_header(io.BytesIO(b"")) == OnnxHeader(0, {})
    assert read_onnx_header(io.BytesIO(field(7, b""))) == OnnxHeader(0, {})


GARBAGE = {
    "truncated": built(8, {"": 13})[:-3],
    "text": b"this is no onnx model at all",
    "zero field": b"\x00\x01",
    "group": field(1, 8) + bytes([(3 << 3) | 3]),
    "past the end": field(1, 8) + varint(7 << 3 | 2) + varint(1 << 40),
    "overlong number": field(1, 8) + varint(1 << 3) + b"\xff" * 11,
    "ir as bytes": field(1, b"\x0e"),
    "opset as number": field(1, 8) + field(8, 21),
    "huge opset": field(1, 8) + field(8, field(1, b"d" * MAX_OPSET_BYTES)),
    "broken opset": field(1, 8) + field(8, b"\x12\xff"),
}


@pytest.mark.parametrize("data", GARBAGE.values(), ids=GARBAGE.keys())
def test_what_is_no_model_header_is_refused_cleanly(data: bytes) -> None:
    with pytest.raises(OnnxFormatError):
        read_onnx_header(io.BytesIO(data))
    problem = onnx_file_problem("m", "1/model.onnx", io.BytesIO(data))
    assert problem.startswith("1/model.onnx of model 'm' is not an ONNX model ("), problem


def test_a_file_of_endless_top_level_fields_is_read_a_bounded_number_of_times() -> None:
    data = field(14, b"") * (MAX_TOP_FIELDS + 1)
    file = CountingFile(data)
    with pytest.raises(OnnxFormatError, match="top-level fields"):
        read_onnx_header(file)
    assert file.bytes_read <= 20 * MAX_TOP_FIELDS


def test_a_file_of_exactly_the_most_top_level_fields_is_read() -> None:
    data = field(1, 8) + field(14, b"") * (MAX_TOP_FIELDS - 1)
    assert read_onnx_header(io.BytesIO(data)) == OnnxHeader(8, {})


def test_too_many_opsets_are_refused() -> None:
    data = field(1, 8) + field(8, field(1, b"d") + field(2, 1)) * 1025
    with pytest.raises(OnnxFormatError, match="more than 1024 opsets"):
        read_onnx_header(io.BytesIO(data))


def test_a_model_newer_than_the_node_reads_is_refused_with_the_export_to_make() -> None:
    problem = onnx_release_problem("m", "1/model.onnx", OnnxHeader(14, {"": 28}))
    assert problem == (
        "1/model.onnx of model 'm' does not load in this node's Triton 24.10: IR 14 is newer "
        "than this node's ONNX Runtime 1.19 reads (<= 10): export with ir_version=10; opset 28 "
        "is newer than this node's ONNX Runtime 1.19 reads (<= 21): export with "
        "opset_version=21"
    )
    only_opset = onnx_release_problem("m", "model.onnx", OnnxHeader(10, {"ai.onnx": 22}))
    assert "IR" not in only_opset and "opset 22 is newer" in only_opset, only_opset
    ml = onnx_release_problem("m", "model.onnx", OnnxHeader(10, {"": 21, "ai.onnx.ml": 6}))
    assert ml.endswith(
        "ai.onnx.ml opset 6 is newer than this node's ONNX Runtime 1.19 reads (<= 5): export "
        "with ai.onnx.ml opset 5"
    ), ml


@pytest.mark.parametrize(
    "header",
    [OnnxHeader(10, {"": 21, "ai.onnx.ml": 5}), OnnxHeader(0, {}), OnnxHeader(7, {"x.y": 99})],
    ids=["bounds", "none", "other-domain"],
)
def test_a_model_within_the_bounds_passes(header: OnnxHeader) -> None:
    assert onnx_release_problem("m", "model.onnx", header) == ""
    assert onnx_file_problem("m", "model.onnx", io.BytesIO(built(10, {"": 21}))) == ""


def test_the_pinned_release_is_the_node_image_s() -> None:
    """One place names the release: the node pod's image and the chart's tag are that release."""
    root = Path(__file__).resolve().parents[3]
    daemonset = (root / "deploy" / "base" / "node" / "node-daemonset.yaml").read_text()
    values = (root / "charts" / "tritonshare" / "values.yaml").read_text()
    assert f"image: {PINNED.image}" in daemonset
    assert f"tag: {PINNED.release}-py3" in values
    assert RELEASES[PINNED.release] is PINNED


def test_the_install_checks_the_versions_of_onnx_runtime_models_only(tmp_path: Path) -> None:
    """OpenVINO opens .onnx files too, with its own reader: ONNX Runtime's bounds are not its."""
    path = tmp_path / "model.onnx"
    path.write_bytes(built())
    problem = onnx_problem("m", path, "1/model.onnx", {"1/model.onnx"})
    assert "does not load in this node's Triton" in problem, problem
    assert onnx_problem("m", path, "1/model.onnx", {"1/model.onnx"}, onnxruntime=False) == ""


def test_the_simulated_cluster_s_own_onnx_model_loads_on_the_node() -> None:
    """`make sim-up`'s convolutional model (and the benchmarks') is within the pinned bounds."""
    assert onnx_file_problem("conv", "1/model.onnx", io.BytesIO(conv_model())) == ""
