"""One REST request that crashed the shared Triton (an independent attack suite's case, run
here first).

Triton 2.51 parses a REST inference body's JSON recursively: nested past about 100,000 to 200,000
levels it overflows its stack and the whole process dies with SIGSEGV, every tenant's model with
it (measured straight at Triton: `{"inputs": {"a": {"a": ...}}}` 100,000 deep answered 400;
200,000 deep, a 1 MB body, killed it; arrays, `[[[...]]]`, 100,000 deep answered and 5,000,000
deep killed it). The gateway and the proxy forwarded inference bodies as they came, checking only
their size (`--max-body`, 1 GiB), so a proven pod killed its node's Triton with one request a
megabyte long, through the gateway (this test failed so: Triton exited -11). The REST relay now
bounds the JSON nesting of what it forwards (`proxy.policy.nesting`), however the body comes:
with Content-Length, compressed, chunked.

The test runs its own Triton (a failure must not take the suite's shared one down) behind a real
gateway process; the attacker is a proven pod calling from its own address.
"""

from __future__ import annotations

import socket
import subprocess
import urllib.request
import zlib
from pathlib import Path

import grpc
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from proxy.policy.nesting import MAX_NESTING
from proxy.policy.shapes import MAX_JSON_BYTES
from sim.triton import TritonServer
from tests.conftest import copy_model
from tests.proxy.gateway.conftest import caller, publish
from tests.proxy.gateway.test_inflate_attacks import (
    ATTACKER,
    GatewayProcess,
    gateway_process,
    grpc_call,
    serving,
)

pytestmark = pytest.mark.triton

DEPTH = 300_000
"""Levels of nesting: past what Triton's parser survives (a 1.5 MB body)."""
DEEP = b'{"inputs":' + b'{"a":' * DEPTH + b"1" + b"}" * DEPTH + b"}"


def exchange(url: str, head: str, body: bytes) -> bytes:
    host, port = url.split(":")
    with socket.create_connection((host, int(port)), source_address=(ATTACKER, 0)) as sock:
        sock.settimeout(30)
        sock.sendall(head.encode() + body)
        answer = b""
        while b"\r\n\r\n" not in answer:
            data = sock.recv(65536)
            if not data:
                break
            answer += data
        return answer


def post(url: str, body: bytes, headers: str = "", route: str = "infer") -> bytes:
    head = (
        f"POST /v2/models/add_one/{route} HTTP/1.1\r\nHost: gateway\r\n"
        f"Content-Type: application/json\r\n{headers}"
    )
    if "chunked" not in headers:
        head += f"Content-Length: {len(body)}\r\n"
    return exchange(url, head + "\r\n", body)


def chunked(body: bytes, size: int = 4096) -> bytes:
    pieces = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


def test_a_deeply_nested_json_body_cannot_crash_triton(
    triton: TritonServer, model_repository: Path, tmp_path: Path
) -> None:
    copy_model("add_one", model_repository)
    load = urllib.request.Request(
        f"http://{triton.http_url}/v2/repository/models/add_one/load", method="POST"
    )
    with urllib.request.urlopen(load, timeout=60) as answer:
        assert answer.status == 200
    table = tmp_path / "callers.json"
    publish(table, caller(ATTACKER, "add_one", "a/crash"))
    # A legitimate tensor with more brackets than the bound, but only three levels deep.
    rows = b",".join(b"[%d.0]" % i for i in range(2 * MAX_NESTING))
    shallow = b'{"inputs":[{"name":"INPUT0","shape":[1,%d],"datatype":"FP32","data":[%s]}]}' % (
        2 * MAX_NESTING,
        rows,
    )
    with gateway_process(triton, table) as gateway:
        answers = {
            # To generate: an infer body with this much JSON is refused by its length alone.
            "content-length": post(gateway.http_url, DEEP, route="generate"),
            # Small enough to arrive whole (the relay's one-write path): 20,000 levels, 40 KB.
            "whole": post(gateway.http_url, b'{"inputs":' + b"[" * 20_000 + b"]" * 20_000 + b"}"),
            "gzip": post(gateway.http_url, zlib.compress(DEEP), "Content-Encoding: deflate\r\n"),
            "chunked": post(gateway.http_url, chunked(DEEP), "Transfer-Encoding: chunked\r\n"),
            "shallow": post(gateway.http_url, shallow),
        }
        assert triton.process is not None
        try:  # a crash takes a moment to end the process
            code: int | None = triton.process.wait(2)
        except subprocess.TimeoutExpired:
            code = None
    assert code is None, f"Triton died (exit {code}); the tenant got {answers}"
    for how in ("content-length", "whole", "gzip", "chunked"):
        assert answers[how].startswith(b"HTTP/1.1 400"), (how, answers[how][:300])
        assert b"nests deeper than" in answers[how], (how, answers[how][:300])
    assert answers["shallow"].startswith(b"HTTP/1.1 200"), answers["shallow"][:300]


def test_a_rest_input_declaring_an_impossible_shape_cannot_crash_triton(
    triton: TritonServer, model_repository: Path, tmp_path: Path
) -> None:
    """`shape: [1, 2**61]` with one value of JSON data, 91 bytes in all: Triton sizes the
    tensor's buffer from the shape (8 EiB) and dies of the failed allocation (exit -6, measured
    straight at Triton and through the gateway; this test failed so before the relays read
    shapes). The same input over gRPC is refused INVALID_ARGUMENT (byte size mismatch). Refused
    now however the body comes and however the key is spelled; a tensor as large as its body
    passes, as JSON and with the binary tensor extension."""
    copy_model("add_one", model_repository)
    load = urllib.request.Request(
        f"http://{triton.http_url}/v2/repository/models/add_one/load", method="POST"
    )
    with urllib.request.urlopen(load, timeout=60) as answer:
        assert answer.status == 200
    table = tmp_path / "callers.json"
    publish(table, caller(ATTACKER, "add_one", "a/crash"))
    bomb = b'{"inputs":[{"name":"INPUT0","shape":[1,%d],"datatype":"FP32","data":[1]}]}' % 2**61
    escaped = bomb.replace(b'"shape"', b'"sh\\u0061pe"')
    first = bomb.replace(b'"datatype"', b'"shape":[1,1],"datatype"')  # Python keeps the last
    header = b'{"inputs":[{"name":"INPUT0","shape":[1,%d],"datatype":"FP32",' % 2**61
    header += b'"parameters":{"binary_data_size":4}}]}'
    binary = f"Inference-Header-Content-Length: {len(header)}\r\n"
    # As large as its body allows: 4 values, JSON and binary (the bytes of 4 FP32 values).
    fits = b'{"inputs":[{"name":"INPUT0","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]}'
    fits_header = header.replace(b"%d" % 2**61, b"4").replace(b":4}", b":16}")
    with gateway_process(triton, table) as gateway:
        url = gateway.http_url
        answers = {
            "whole": post(url, bomb),
            "escaped key": post(url, escaped),
            "duplicate key": post(url, first),
            # Past what arrives in one read: relayed in pieces, checked before the last.
            "in pieces": post(url, bomb + b" " * 600_000),
            "chunked": post(url, chunked(bomb, 7), "Transfer-Encoding: chunked\r\n"),
            "deflate": post(url, zlib.compress(bomb), "Content-Encoding: deflate\r\n"),
            "binary": post(url, header + b"\0" * 4, binary),
            "fits": post(url, fits),
            # Too much JSON to check: refused before it is read, with what to do instead.
            "too much JSON": post(url, fits + b" " * MAX_JSON_BYTES),
            "fits, binary": post(
                url,
                fits_header + b"\0" * 16,
                f"Inference-Header-Content-Length: {len(fits_header)}\r\n",
            ),
        }
        assert triton.process is not None
        try:
            code: int | None = triton.process.wait(2)
        except subprocess.TimeoutExpired:
            code = None
    assert code is None, f"Triton died (exit {code}); the tenant got {answers}"
    for how, answer in answers.items():
        if how.startswith("fits"):
            assert answer.startswith(b"HTTP/1.1 200"), (how, answer[:300])
        elif how == "too much JSON":
            assert answer.startswith(b"HTTP/1.1 413"), (how, answer[:300])
            assert b"binary tensor extension" in answer, answer[:300]
        else:
            assert answer.startswith(b"HTTP/1.1 400"), (how, answer[:300])
            assert b"more elements in" in answer, (how, answer[:300])


INFER = "/inference.GRPCInferenceService/ModelInfer"


def infer_request(
    shape: list[int], datatype: str = "FP32", raw: list[bytes] | None = None, pad: int = 0
) -> service_pb2.ModelInferRequest:
    """A ModelInferRequest to add_one with one input of `shape` and `datatype` and the given
    raw_input_contents; `pad` bytes of a request parameter make it large (read in pieces)."""
    request = service_pb2.ModelInferRequest(model_name="add_one", id="attack")
    request.inputs.add(name="INPUT0", datatype=datatype, shape=shape)
    request.raw_input_contents.extend(raw if raw is not None else [])
    if pad:
        request.parameters["pad"].string_param = "x" * pad
    return request


def test_a_grpc_input_declaring_an_impossible_shape_cannot_reach_triton(
    triton: TritonServer, model_repository: Path, tmp_path: Path
) -> None:
    """`shape: [1, 2**62]` FP32 over zero bytes of raw_input_contents: 2**62 elements of 4 bytes
    are 2**64 bytes, which Triton 2.51's int64 size check wraps to 0, the size of the data, so
    the request reached the Python backend. The relays refuse it INVALID_ARGUMENT (in-stream
    on ModelStreamInfer) before its last byte reaches Triton, however it comes: whole, read in
    pieces, compressed, through the pod's proxy or straight at the gateway; so are raw lengths
    that do not match the shape, BYTES whose length prefixes run past the data, typed contents
    of another count, and raw contents for fewer inputs than the request has. A request whose
    data matches its shape is answered by Triton."""
    copy_model("add_one", model_repository)
    load = urllib.request.Request(
        f"http://{triton.http_url}/v2/repository/models/add_one/load", method="POST"
    )
    with urllib.request.urlopen(load, timeout=60) as answer:
        assert answer.status == 200
    table = tmp_path / "callers.json"
    publish(table, caller(ATTACKER, "add_one", "a/crash"))
    bomb = infer_request([1, 2**62], raw=[b""])
    typed = infer_request([1, 2**62])
    typed.inputs[0].contents.fp32_contents.append(1.0)
    strings = infer_request([2], "BYTES", [b"\x01\x00\x00\x00a\xff\xff\xff\x7fb"])
    two_inputs = infer_request([1, 1], raw=[b"\x00" * 4])
    two_inputs.inputs.add(name="INPUT1", datatype="FP32", shape=[1, 2**62])
    refused = {
        "[1, 2**62] over zero bytes": bomb,
        "read in pieces": infer_request([1, 2**62], raw=[b""], pad=64 * 1024),
        "no data at all": infer_request([1, 2**62]),
        "negative dimension": infer_request([-1, -4], raw=[b"\x00" * 16]),
        "raw shorter than the shape": infer_request([1, 4], raw=[b"\x00" * 12]),
        "raw longer than the shape": infer_request([1, 4], raw=[b"\x00" * 20]),
        "BYTES prefix past the data": strings,
        "BYTES without prefixes": infer_request([4], "BYTES", [b"abcd"]),
        "typed contents": typed,
        "raw for one of two inputs": two_inputs,
    }
    fits = infer_request([1, 4], raw=[b"\x00" * 16])
    fits_large = infer_request([1, 4], raw=[b"\x00" * 16], pad=64 * 1024)
    with (
        gateway_process(triton, table) as gateway,
        serving("proxy", pod_flags(gateway)) as proxy,
        grpc.insecure_channel(proxy.grpc_url) as channel,
    ):
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        answers: dict[str, tuple[grpc.StatusCode, str]] = {}
        for how, request in refused.items():
            answers[how] = unary(stub, request)
            # Straight at the gateway, as a tenant that bypasses its proxy would send it.
            direct = grpc_call(
                gateway.grpc_url, ATTACKER, INFER, request.SerializeToString(), "identity"
            )
            assert direct.get("grpc-status") == "3", (how, direct)  # INVALID_ARGUMENT
        compressor = zlib.compressobj(6, zlib.DEFLATED, 31)
        gzipped = compressor.compress(bomb.SerializeToString()) + compressor.flush()
        compressed = grpc_call(gateway.grpc_url, ATTACKER, INFER, gzipped, "gzip")
        in_stream = list(stub.ModelStreamInfer(iter([bomb, fits]), timeout=60))
        fitting = {"whole": unary(stub, fits), "large": unary(stub, fits_large)}
        assert triton.process is not None
        try:
            code: int | None = triton.process.wait(2)
        except subprocess.TimeoutExpired:
            code = None
    assert code is None, f"Triton died (exit {code}); the tenant got {answers}"
    for how, (status, details) in answers.items():
        assert status == grpc.StatusCode.INVALID_ARGUMENT, (how, status, details)
        assert "the inference request's" in details, (how, details)
    assert compressed.get("grpc-status") == "3", compressed
    assert "the inference request's" in compressed.get("grpc-message", ""), compressed
    assert [bool(r.error_message) for r in in_stream] == [True, False], in_stream
    assert "the inference request's" in in_stream[0].error_message
    assert in_stream[0].infer_response.id == "attack"
    assert fitting == {"whole": (grpc.StatusCode.OK, ""), "large": (grpc.StatusCode.OK, "")}


def pod_flags(gateway: GatewayProcess) -> list[str]:
    """The pod's own proxy for add_one, sending to `gateway` from the attacker's address."""
    upstream = ["--triton-http-url", gateway.http_url, "--triton-grpc-url", gateway.grpc_url]
    return [
        "--model-id",
        "add_one",
        "--source-address",
        ATTACKER,
        "--drain-seconds",
        "0",
        *upstream,
    ]


def unary(
    stub: service_pb2_grpc.GRPCInferenceServiceStub, request: service_pb2.ModelInferRequest
) -> tuple[grpc.StatusCode, str]:
    try:
        stub.ModelInfer(request, timeout=60)
    except grpc.RpcError as e:
        return e.code(), e.details() or ""
    return grpc.StatusCode.OK, ""
