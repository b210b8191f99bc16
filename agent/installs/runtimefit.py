"""Whether a model's files are ones the node's Triton release reads, checked before it loads them.

ONNX Runtime refuses a model whose IR version or default-domain (or `ai.onnx.ml`) opset is newer
than the ONNX it was built with ("Unsupported model IR version", "Current official support for
domain ai.onnx is till opset N"); a model exported with a newer `onnx` or exporter runs on a laptop
and fails on the node. The agent reads these numbers from the model's header and refuses the
install with what to export instead, against the release the node pins
(`common.tritonrelease.PINNED`).

The reader is built for a tenant's file: it reads only ModelProto's top-level field headers
(`ir_version` is field 1, `opset_import` field 8; the graph, field 7, comes before the opsets in the
order writers use, so no prefix of the file holds them all) and steps over each payload by its
length, reading only the opset entries themselves. A 2 GiB model costs a few hundred bytes read;
a truncated, garbled or oversized field is refused with OnnxFormatError, never read past.

A TensorRT plan is not checked: its layout is TensorRT's own and undocumented, and TensorRT itself
refuses at load a plan built by another version (docs/support.md).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import BinaryIO

from agent.installs.onnxmodel import MAX_BYTES, OnnxFormatError
from common.tritonrelease import DEFAULT_ONNX_DOMAINS, ML_ONNX_DOMAIN, PINNED, TritonRelease

MAX_TOP_FIELDS = 65_536
"""Top-level fields read at most: a model has a dozen, plus one per metadata entry."""
MAX_OPSETS = 1024
"""`opset_import` entries read at most: a model imports a handful of domains."""
MAX_OPSET_BYTES = 1024
"""The largest `opset_import` entry read (a domain name and a version)."""
_IR_VERSION, _OPSET_IMPORT = 1, 8
_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5
_VARINT_BYTES = 10


@dataclass(frozen=True)
class OnnxHeader:
    """What a model's runtime checks before anything else."""

    ir_version: int
    """ModelProto's `ir_version` (0 when the file has none)."""
    opsets: Mapping[str, int]
    """Domain -> the newest version the model imports of it."""

    @property
    def default_opset(self) -> int:
        """The model's opset of ONNX's default domain (0 when it imports none)."""
        return max((v for d, v in self.opsets.items() if d in DEFAULT_ONNX_DOMAINS), default=0)


def read_onnx_header(file: BinaryIO) -> OnnxHeader:
    """The IR version and opsets of the ONNX model in `file` (a binary file that seeks), read
    field header by field header; OnnxFormatError when the file is no ModelProto."""
    end = file.seek(0, os.SEEK_END)
    if end > MAX_BYTES:
        raise OnnxFormatError(
            f"it is {end} bytes, over protobuf's 2 GiB; keep the weights as external data"
        )
    ir_version, opsets, at, entries = 0, dict[str, int](), 0, 0
    for _ in range(MAX_TOP_FIELDS):
        if at >= end:
            return OnnxHeader(ir_version, opsets)
        file.seek(at)
        head = file.read(min(2 * _VARINT_BYTES, end - at))
        tag, used = _varint(head, 0, at)
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise OnnxFormatError(f"field number 0 at byte {at}")
        if (number == _IR_VERSION and wire != _VARINT) or (
            number == _OPSET_IMPORT and wire != _LENGTH
        ):
            raise OnnxFormatError(f"field {number} at byte {at} has the wrong wire type {wire}")
        if wire == _VARINT:
            value, after = _varint(head, used, at)
            if number == _IR_VERSION:
                ir_version = value - 2**64 if value >= 2**63 else value  # int64, as written
            at += after
        elif wire == _LENGTH:
            size, after = _varint(head, used, at)
            first = at + after
            if first + size > end:
                raise OnnxFormatError(f"a field at byte {at} runs past the end of the file")
            if number == _OPSET_IMPORT:
                entries += 1
                if size > MAX_OPSET_BYTES:
                    raise OnnxFormatError(
                        f"the opset_import at byte {at} is {size} bytes, larger than any opset"
                    )
                if entries > MAX_OPSETS:
                    raise OnnxFormatError(f"it imports more than {MAX_OPSETS} opsets")
                file.seek(first)
                domain, version = _opset(file.read(size), first)
                opsets[domain] = max(version, opsets.get(domain, version))
            at = first + size
        elif wire in (_FIXED64, _FIXED32):
            at += used + (8 if wire == _FIXED64 else 4)
            if at > end:
                raise OnnxFormatError(f"a field before byte {at} runs past the end of the file")
        else:
            raise OnnxFormatError(f"wire type {wire} at byte {at} is not used by ONNX")
    if at >= end:
        return OnnxHeader(ir_version, opsets)
    raise OnnxFormatError(f"it has more than {MAX_TOP_FIELDS} top-level fields")


def onnx_release_problem(
    model_id: str, name: str, header: OnnxHeader, release: TritonRelease = PINNED
) -> str:
    """Why `release`'s ONNX Runtime would refuse the model file `name` ("" when it reads it),
    with the export that it reads."""
    runtime = ".".join(release.onnxruntime.split(".")[:2])
    problems = []
    if header.ir_version > release.onnx_max_ir:
        problems.append(
            f"IR {header.ir_version} is newer than this node's ONNX Runtime {runtime} reads "
            f"(<= {release.onnx_max_ir}): export with ir_version={release.onnx_max_ir}"
        )
    if header.default_opset > release.onnx_max_opset:
        problems.append(
            f"opset {header.default_opset} is newer than this node's ONNX Runtime {runtime} "
            f"reads (<= {release.onnx_max_opset}): export with "
            f"opset_version={release.onnx_max_opset}"
        )
    ml_opset = header.opsets.get(ML_ONNX_DOMAIN, 0)
    if ml_opset > release.onnx_max_ml_opset:
        problems.append(
            f"{ML_ONNX_DOMAIN} opset {ml_opset} is newer than this node's ONNX Runtime {runtime} "
            f"reads (<= {release.onnx_max_ml_opset}): export with {ML_ONNX_DOMAIN} opset "
            f"{release.onnx_max_ml_opset}"
        )
    if not problems:
        return ""
    return (
        f"{name} of model {model_id!r} does not load in this node's Triton {release.release}: "
        f"{'; '.join(problems)}"
    )


def onnx_file_problem(model_id: str, name: str, file: BinaryIO) -> str:
    """Why the model's ONNX file `name`, open as `file`, may not be installed on this node ("" when
    it may): it is no ONNX model, or the node's ONNX Runtime does not read its version."""
    try:
        header = read_onnx_header(file)
    except OnnxFormatError as e:
        return (
            f"{name} of model {model_id!r} is not an ONNX model ({e}); install the file "
            f"onnxruntime loads"
        )
    return onnx_release_problem(model_id, name, header)


def _varint(data: bytes, at: int, offset: int) -> tuple[int, int]:
    """The number at data[at:] and the index after it; `offset` is data's place in the file."""
    value, shift = 0, 0
    for index in range(at, min(len(data), at + _VARINT_BYTES)):
        byte = data[index]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, index + 1
        shift += 7
    raise OnnxFormatError(f"a truncated or overlong number at byte {offset + at}")


def _opset(data: bytes, offset: int) -> tuple[str, int]:
    """(domain, version) of an OperatorSetIdProto."""
    domain, version, at = "", 0, 0
    while at < len(data):
        tag, at = _varint(data, at, offset)
        number, wire = tag >> 3, tag & 7
        if wire == _VARINT:
            value, at = _varint(data, at, offset)
            if number == 2:
                version = value - 2**64 if value >= 2**63 else value
        elif wire == _LENGTH:
            size, at = _varint(data, at, offset)
            if at + size > len(data):
                raise OnnxFormatError(f"an opset_import at byte {offset} runs past its end")
            if number == 1:
                domain = data[at : at + size].decode("utf-8", errors="replace")
            at += size
        elif wire in (_FIXED64, _FIXED32):
            at += 8 if wire == _FIXED64 else 4
            if at > len(data):
                raise OnnxFormatError(f"an opset_import at byte {offset} runs past its end")
        else:
            raise OnnxFormatError(f"wire type {wire} in the opset_import at byte {offset}")
    return domain, version
