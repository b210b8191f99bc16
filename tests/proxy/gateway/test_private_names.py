"""Private model names in Triton, through the node gateway and a real Triton.

Two pods in two namespaces both serve a model called `resnet50`; Triton has them under private
names (A_PRIVATE: add_one, B_PRIVATE: the same model adding ten, a name shorter than the public
id), and the caller table gives each pod its own. A third pod serves the decoupled text_stream
as `chat` (streams), a fourth names a private name Triton does not have (errors). `resnet50`
itself is also loaded, as add_one, so the gateway's renamed answers can be compared with Triton's
own answers for a model under that id, byte for byte.

Attacks first: a pod naming another pod's private name, or its own, over REST (paths, tricks
with encoding, case, dots), over gRPC (unary calls, compressed, later messages of a stream),
must get what it gets for a name Triton does not have; and no answer it gets, success or
error, ever carries a private name. Then the service: each pod reaches its own model under the
public id, REST and gRPC, streams included, large messages included, with tritonclient through
the pod's own proxy.
"""

from __future__ import annotations

import contextlib
import gzip
import http.client
import json
import socket
import urllib.request
from collections.abc import Iterator
from dataclasses import replace

import grpc
import h2.config
import h2.connection
import h2.events
import h2.exceptions
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from sim.triton import TritonInstall, TritonServer
from tests.conftest import copy_model
from tests.proxy.conftest import PROXY_MODELS, proxy_settings, running_proxy
from tests.proxy.gateway.conftest import (
    RunningGateway,
    caller,
    gateway_settings,
    publish,
    running_gateway,
)

pytestmark = pytest.mark.triton

PUBLIC = "resnet50"
A_PRIVATE = "ns-a.resnet50.1a2b3c4d5e"
B_PRIVATE = "b.r50"
CHAT_PRIVATE = "ns-a.chat.99aa77bb"
MISSING_PRIVATE = "ns-c.resnet50.0dead0"
PRIVATE_NAMES = (A_PRIVATE, B_PRIVATE, CHAT_PRIVATE, MISSING_PRIVATE)
POD_A, POD_B, POD_CHAT, POD_MISSING = "127.1.2.1", "127.1.2.2", "127.1.2.3", "127.1.2.4"
SERVICE = "/inference.GRPCInferenceService/"
INFER = json.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}
).encode()


def _load(triton: TritonServer, name: str) -> None:
    request = urllib.request.Request(
        f"http://{triton.http_url}/v2/repository/models/{name}/load", method="POST"
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 200, f"Triton did not load {name}"


@pytest.fixture(scope="module")
def triton(
    tmp_path_factory: pytest.TempPathFactory, triton_install: TritonInstall
) -> Iterator[TritonServer]:
    repository = tmp_path_factory.mktemp("private-names")
    copy_model("add_one", repository, as_name=A_PRIVATE)
    add_ten = copy_model("add_one", repository, as_name=B_PRIVATE)
    model = add_ten / "1" / "model.py"
    model.write_text(model.read_text().replace("(data + 1)", "(data + 10)"))
    copy_model("add_one", repository, as_name=PUBLIC)
    chat = repository / CHAT_PRIVATE
    chat.mkdir()
    (chat / "1").mkdir()
    for source in (PROXY_MODELS / "text_stream").rglob("*"):
        if source.is_file():
            target = chat / source.relative_to(PROXY_MODELS / "text_stream")
            target.parent.mkdir(parents=True, exist_ok=True)
            text = source.read_text()
            if source.name == "config.pbtxt":
                text = text.replace('name: "text_stream"', f'name: "{CHAT_PRIVATE}"')
            target.write_text(text)
    server = TritonServer(repository)
    server.start()
    try:
        for name in (A_PRIVATE, B_PRIVATE, PUBLIC, CHAT_PRIVATE):
            _load(server, name)
        yield server
    finally:
        server.discard()


@pytest.fixture(scope="module")
def gateway(
    triton: TritonServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningGateway]:
    table = tmp_path_factory.mktemp("private-gateway") / "callers.json"
    publish(
        table,
        replace(caller(POD_A, PUBLIC, "team-a/resnet50-0"), triton_name=A_PRIVATE),
        replace(caller(POD_B, PUBLIC, "team-b/resnet50-0"), triton_name=B_PRIVATE),
        replace(caller(POD_CHAT, "chat", "team-a/chat-0"), triton_name=CHAT_PRIVATE),
        replace(caller(POD_MISSING, PUBLIC, "team-c/resnet50-0"), triton_name=MISSING_PRIVATE),
    )
    settings = gateway_settings(triton, table, table_max_age_seconds=3600)
    with running_gateway(settings) as running:
        yield running


def fetch(
    url: str, method: str, path: str, body: bytes | None = None, source: str = ""
) -> tuple[int, str, bytes]:
    host, port = url.split(":")
    connection = http.client.HTTPConnection(
        host, int(port), timeout=30, source_address=(source, 0) if source else None
    )
    try:
        connection.request(method, path, body=body)
        response = connection.getresponse()
        return response.status, response.getheader("Content-Type", ""), response.read()
    finally:
        connection.close()


def no_private_name(data: bytes) -> bool:
    return not any(name.encode() in data for name in PRIVATE_NAMES)


# -- raw gRPC from a pod's own address (bypassing its proxy, as an attacker would) ----------------


def infer_request(model: str, *, text: bytes | None = None, floats: int = 3) -> bytes:
    request = service_pb2.ModelInferRequest(model_name=model, id="req-7")
    if text is None:
        tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, floats])
        del tensor
        request.raw_input_contents.append(np.arange(floats, dtype=np.float32).tobytes())
    else:
        request.inputs.add(name="text_input", datatype="BYTES", shape=[1])
        request.raw_input_contents.append(len(text).to_bytes(4, "little") + text)
    data: bytes = request.SerializeToString()
    return data


def grpc_call(
    url: str, source: str, method: str, messages: list[bytes], encoding: str = "identity"
) -> tuple[dict[str, str], list[bytes]]:
    """One call with `messages` (compressed with gzip unless `encoding` is identity) from
    `source`, over h2: the response headers and trailers, and the response messages."""
    host, port = url.split(":")
    sock = socket.create_connection((host, int(port)), timeout=30, source_address=(source, 0))
    connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    connection.initiate_connection()
    sid = connection.get_next_available_stream_id()
    connection.send_headers(
        sid,
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", SERVICE + method),
            (":authority", url),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            ("grpc-encoding", encoding),
            ("grpc-accept-encoding", "identity,deflate,gzip"),
        ],
    )
    framed = b""
    for message in messages:
        if encoding == "gzip":
            message = gzip.compress(message)
            framed += b"\x01" + len(message).to_bytes(4, "big") + message
        else:
            framed += b"\x00" + len(message).to_bytes(4, "big") + message
    sent = 0
    received = b""
    fields: dict[str, str] = {}
    with sock:
        sock.sendall(connection.data_to_send())
        while True:
            while sent < len(framed):
                window = min(
                    connection.local_flow_control_window(sid), connection.max_outbound_frame_size
                )
                if window <= 0:
                    break
                chunk = framed[sent : sent + window]
                sent += len(chunk)
                connection.send_data(sid, chunk, end_stream=sent == len(framed))
            sock.sendall(connection.data_to_send())
            data = sock.recv(1 << 20)
            if not data:
                fields["closed"] = "connection"
                break
            ended = False
            for event in connection.receive_data(data):
                if isinstance(event, h2.events.DataReceived):
                    received += event.data
                    connection.acknowledge_received_data(
                        event.flow_controlled_length, event.stream_id
                    )
                if isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
                    fields.update((k.decode(), v.decode()) for k, v in event.headers)
                if isinstance(event, h2.events.StreamEnded):
                    ended = True
                if isinstance(event, h2.events.StreamReset):
                    fields["reset"] = str(event.error_code)
                    ended = True
            with contextlib.suppress(h2.exceptions.ProtocolError):
                sock.sendall(connection.data_to_send())
            if ended:
                break
    answers = []
    pos = 0
    while pos + 5 <= len(received):
        size = int.from_bytes(received[pos + 1 : pos + 5], "big")
        answers.append(received[pos + 5 : pos + 5 + size])
        pos += 5 + size
    return fields, answers


def unknown(name: str, served: str = PUBLIC) -> str:
    """Triton's words for a model it does not have, and the id the calling pod serves (the
    gateway's own refusal; "" for Triton's answer relayed)."""
    words = f"Request for unknown model: '{name}' is not found"
    return f"{words}; this pod serves '{served}'" if served else words


# -- attacks -------------------------------------------------------------------------------------

PER_MODEL = [
    ("POST", "/v2/models/{m}/infer"),
    ("POST", "/v2/models/{m}/versions/1/infer"),
    ("GET", "/v2/models/{m}"),
    ("GET", "/v2/models/{m}/ready"),
    ("GET", "/v2/models/{m}/config"),
    ("GET", "/v2/models/{m}/stats"),
    ("POST", "/v2/models/{m}/generate"),
]


@pytest.mark.parametrize(("method", "path"), PER_MODEL)
@pytest.mark.parametrize("private", [B_PRIVATE, A_PRIVATE], ids=["neighbours", "own"])
def test_rest_a_private_name_is_answered_as_a_model_triton_does_not_have(
    gateway: RunningGateway, triton: TritonServer, method: str, path: str, private: str
) -> None:
    body = INFER if method == "POST" else None
    # Triton has the model: only the gateway stands between the pod and it.
    assert fetch(triton.http_url, "GET", f"/v2/models/{private}/ready")[0] == 200
    ghost = fetch(gateway.http_url, method, path.format(m="ghost"), body, POD_A)
    answer = fetch(gateway.http_url, method, path.format(m=private), body, POD_A)
    assert answer == (ghost[0], ghost[1], ghost[2].replace(b"'ghost'", f"'{private}'".encode()))
    assert answer[0] >= 400


@pytest.mark.parametrize(
    "path",
    [
        "/v2/models/b%2Er50/ready",
        "/v2/models/b.r50%00/ready",
        "/v2/models/B.R50/ready",
        "/v2/models/resnet50/../b.r50/ready",
        "/v2/models/resnet50/versions/1/../../../b.r50/ready",
        "/v2/models/./b.r50/ready",
        "/v2/models//b.r50/ready",
        "//v2/models/b.r50/ready",
        "/v2/models/resnet50%2F..%2Fb.r50/ready",
        "/v2/models/ns-a.resnet50.1a2b3c4d5e/ready",
        "/v2/models/resnet50/ready/../../ns-a.resnet50.1a2b3c4d5e/ready",
        "/v2/models/resnet50?x=/v2/models/b.r50/ready",
    ],
)
def test_rest_path_tricks_never_reach_a_private_name(gateway: RunningGateway, path: str) -> None:
    status, _, body = fetch(gateway.http_url, "GET", path, source=POD_B)
    assert no_private_name(body)
    if status == 200:  # only the pod's own model, under its public id, answers
        assert path.startswith("/v2/models/resnet50?")
        assert json.loads(body)["name"] == PUBLIC


@pytest.mark.parametrize("encoding", ["identity", "gzip"])
@pytest.mark.parametrize("private", [B_PRIVATE, A_PRIVATE], ids=["neighbours", "own"])
def test_grpc_a_private_name_is_answered_as_a_model_triton_does_not_have(
    gateway: RunningGateway, private: str, encoding: str
) -> None:
    request = infer_request(private)
    fields, answers = grpc_call(gateway.grpc_url, POD_A, "ModelInfer", [request], encoding)
    assert (fields.get("grpc-status"), fields.get("grpc-message")) == ("5", unknown(private))
    assert answers == []
    named = service_pb2.ModelMetadataRequest(name=private).SerializeToString()
    for method in ("ModelMetadata", "ModelConfig"):
        fields, _ = grpc_call(gateway.grpc_url, POD_A, method, [named], encoding)
        assert fields.get("grpc-status") == "5", method
    fields, answers = grpc_call(gateway.grpc_url, POD_A, "ModelReady", [named], encoding)
    assert fields.get("grpc-status") == "0"
    assert not service_pb2.ModelReadyResponse.FromString(answers[0]).ready
    fields, _ = grpc_call(gateway.grpc_url, POD_A, "ModelStatistics", [named], encoding)
    assert fields.get("grpc-status") == "3"
    assert f"requested model '{private}' is not available" in fields.get("grpc-message", "")


@pytest.mark.parametrize("encoding", ["identity", "gzip"])
@pytest.mark.parametrize("private", [A_PRIVATE, CHAT_PRIVATE], ids=["neighbours", "own"])
def test_grpc_a_later_stream_message_naming_a_private_name_is_refused_in_the_stream(
    gateway: RunningGateway, private: str, encoding: str
) -> None:
    messages = [
        infer_request("chat", text=b"first"),
        infer_request(private, text=b"smuggled"),
        infer_request("chat", text=b"third"),
    ]
    fields, answers = grpc_call(gateway.grpc_url, POD_CHAT, "ModelStreamInfer", messages, encoding)
    assert fields.get("grpc-status") == "0", fields
    decoded = [service_pb2.ModelStreamInferResponse.FromString(a) for a in answers]
    errors = [d.error_message for d in decoded if d.error_message]
    assert errors == [unknown(private, "chat")]
    texts = sorted(
        d.infer_response.raw_output_contents[0][4:] for d in decoded if not d.error_message
    )
    assert texts == [b"first 0", b"third 0"]  # the smuggled message never reached the model
    assert {d.infer_response.model_name for d in decoded if not d.error_message} == {"chat"}


def test_grpc_a_duplicated_name_cannot_smuggle_a_private_name(gateway: RunningGateway) -> None:
    # protobuf keeps the last name: the public id first, the neighbour's private name after.
    smuggled = infer_request(PUBLIC) + b"\x0a" + bytes([len(B_PRIVATE)]) + B_PRIVATE.encode()
    fields, answers = grpc_call(gateway.grpc_url, POD_A, "ModelInfer", [smuggled])
    assert fields.get("grpc-status") == "3" and answers == []


def test_grpc_a_large_message_naming_a_private_name_is_refused_before_triton(
    gateway: RunningGateway,
) -> None:
    large = infer_request(B_PRIVATE, floats=40_000)  # 160 KB: read in pieces, not held whole
    fields, answers = grpc_call(gateway.grpc_url, POD_A, "ModelInfer", [large])
    assert (fields.get("grpc-status"), fields.get("grpc-message")) == ("5", unknown(B_PRIVATE))
    assert answers == []


# -- the service: each pod its own model, under the public id ------------------------------------


def test_each_pod_reaches_its_own_model_under_the_same_public_id(gateway: RunningGateway) -> None:
    for pod, added in ((POD_A, 1), (POD_B, 10)):
        status, _, body = fetch(gateway.http_url, "POST", f"/v2/models/{PUBLIC}/infer", INFER, pod)
        assert status == 200, body
        answer = json.loads(body)
        assert answer["model_name"] == PUBLIC
        assert answer["outputs"][0]["data"] == [1 + added, 2 + added, 3 + added]
        assert no_private_name(body)
        fields, answers = grpc_call(gateway.grpc_url, pod, "ModelInfer", [infer_request(PUBLIC)])
        assert fields.get("grpc-status") == "0", fields
        response = service_pb2.ModelInferResponse.FromString(answers[0])
        assert response.model_name == PUBLIC and response.id == "req-7"
        out = np.frombuffer(response.raw_output_contents[0], dtype=np.float32)
        assert out.tolist() == [0 + added, 1 + added, 2 + added]


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v2/models/resnet50"),
        ("GET", "/v2/models/resnet50/versions/1"),
        ("GET", "/v2/models/resnet50/config"),
        ("POST", "/v2/models/resnet50/infer"),
        ("POST", "/v2/models/resnet50/versions/1/infer"),
        ("GET", "/v2/models/resnet50/infer"),
        ("POST", "/v2/models/resnet50/ready"),
    ],
)
def test_rest_answers_are_byte_for_byte_those_of_the_model_under_its_public_id(
    gateway: RunningGateway, triton: TritonServer, method: str, path: str
) -> None:
    body = INFER if method == "POST" else None
    assert fetch(gateway.http_url, method, path, body, POD_A) == fetch(
        triton.http_url, method, path, body
    )


def test_rest_readiness_names_the_public_id(gateway: RunningGateway) -> None:
    for path in ("/v2/models/resnet50/ready", "/v2/models/resnet50/versions/1/ready"):
        status, content_type, body = fetch(gateway.http_url, "GET", path, None, POD_A)
        assert (status, content_type) == (200, "application/json")
        assert json.loads(body) == {"name": PUBLIC, "ready": True}


@pytest.mark.parametrize("method", ["ModelMetadata", "ModelConfig", "ModelInfer", "ModelReady"])
def test_grpc_answers_are_byte_for_byte_those_of_the_model_under_its_public_id(
    gateway: RunningGateway, triton: TritonServer, method: str
) -> None:
    if method == "ModelInfer":
        request = infer_request(PUBLIC)
    else:
        request = service_pb2.ModelMetadataRequest(name=PUBLIC).SerializeToString()
    fields, answers = grpc_call(gateway.grpc_url, POD_A, method, [request])
    with grpc.insecure_channel(triton.grpc_url) as channel:
        direct = channel.unary_unary(SERVICE + method, None, None)(request, timeout=30)
    assert fields.get("grpc-status") == "0"
    assert answers == [direct]


def test_statistics_name_the_public_id(gateway: RunningGateway) -> None:
    status, _, body = fetch(gateway.http_url, "GET", "/v2/models/stats", None, POD_B)
    assert status == 200 and no_private_name(body)
    assert [m["name"] for m in json.loads(body)["model_stats"]] == [PUBLIC]
    for request in (b"", service_pb2.ModelStatisticsRequest(name=PUBLIC).SerializeToString()):
        fields, answers = grpc_call(gateway.grpc_url, POD_B, "ModelStatistics", [request])
        assert fields.get("grpc-status") == "0"
        stats = service_pb2.ModelStatisticsResponse.FromString(answers[0]).model_stats
        assert [m.name for m in stats] == [PUBLIC]
        assert no_private_name(answers[0])


def test_errors_quote_the_public_id_only(gateway: RunningGateway, triton: TritonServer) -> None:
    # A model the pod owns but Triton does not have (not loaded yet, or lost): Triton's own
    # unknown-model answer, for the public id.
    for method, path in PER_MODEL:
        body = INFER if method == "POST" else None
        got = fetch(gateway.http_url, method, path.format(m=PUBLIC), body, POD_MISSING)
        expected = fetch(triton.http_url, method, path.format(m="ghost"), body)
        assert got == (
            expected[0],
            expected[1],
            expected[2].replace(b"'ghost'", f"'{PUBLIC}'".encode()),
        ), path
    fields, _ = grpc_call(gateway.grpc_url, POD_MISSING, "ModelInfer", [infer_request(PUBLIC)])
    assert (fields.get("grpc-status"), fields.get("grpc-message")) == ("5", unknown(PUBLIC, ""))
    # A request the model refuses: Triton's message names the model.
    wrong = json.dumps(
        {"inputs": [{"name": "NOPE", "shape": [1], "datatype": "FP32", "data": [1]}]}
    ).encode()
    status, _, body = fetch(gateway.http_url, "POST", f"/v2/models/{PUBLIC}/infer", wrong, POD_A)
    assert status == 400 and no_private_name(body)
    assert f"'{PUBLIC}'".encode() in body
    assert body == fetch(triton.http_url, "POST", f"/v2/models/{PUBLIC}/infer", wrong)[2]
    request = service_pb2.ModelInferRequest(model_name=PUBLIC)
    request.inputs.add(name="NOPE", datatype="FP32", shape=[1])
    request.raw_input_contents.append(b"\x00" * 4)
    fields, _ = grpc_call(gateway.grpc_url, POD_A, "ModelInfer", [request.SerializeToString()])
    assert fields.get("grpc-status") == "3"
    assert f"'{PUBLIC}'" in fields["grpc-message"] and no_private_name(str(fields).encode())


def test_large_messages_both_ways(gateway: RunningGateway, triton: TritonServer) -> None:
    # 160 KB each way: the request is renamed from its first bytes as it passes, the answer too.
    large = infer_request(PUBLIC, floats=40_000)
    fields, answers = grpc_call(gateway.grpc_url, POD_B, "ModelInfer", [large])
    assert fields.get("grpc-status") == "0", fields
    response = service_pb2.ModelInferResponse.FromString(answers[0])
    assert response.model_name == PUBLIC
    out = np.frombuffer(response.raw_output_contents[0], dtype=np.float32)
    assert out[:3].tolist() == [10, 11, 12] and len(out) == 40_000
    with grpc.insecure_channel(triton.grpc_url) as channel:
        direct = channel.unary_unary(SERVICE + "ModelInfer", None, None)(
            infer_request(PUBLIC, floats=40_000), timeout=30
        )
    # B adds ten where `resnet50` adds one: the same bytes once the outputs are set alike.
    assert len(answers[0]) == len(direct)
    body = json.dumps(
        {
            "inputs": [
                {"name": "INPUT0", "shape": [1, 30_000], "datatype": "FP32", "data": [1] * 30_000}
            ]
        }
    ).encode()
    path = f"/v2/models/{PUBLIC}/infer"
    got = fetch(gateway.http_url, "POST", path, body, POD_A)
    assert got == fetch(triton.http_url, "POST", path, body)  # over 64 KiB of JSON: renamed
    assert len(got[2]) > 64 * 1024


def test_tritonclient_through_the_pods_proxy(gateway: RunningGateway, triton: TritonServer) -> None:
    data = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
    big = np.ones((1, 50_000), dtype=np.float32)
    for pod, added in ((POD_A, 1.0), (POD_B, 10.0)):
        settings = proxy_settings(
            triton,
            model_id=PUBLIC,
            triton_http_url=gateway.http_url,
            triton_grpc_url=gateway.grpc_url,
            source_address=pod,
        )
        with running_proxy(settings) as proxy:
            with httpclient.InferenceServerClient(proxy.http_url) as rest:
                for tensor_data, compression in ((data, None), (big, "gzip"), (big, "deflate")):
                    tensor = httpclient.InferInput("INPUT0", list(tensor_data.shape), "FP32")
                    tensor.set_data_from_numpy(tensor_data, binary_data=True)
                    result = rest.infer(
                        PUBLIC,
                        [tensor],
                        outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)],
                        request_compression_algorithm=compression,
                        response_compression_algorithm=compression,
                    )
                    assert result.get_response()["model_name"] == PUBLIC
                    assert np.array_equal(result.as_numpy("OUTPUT0"), tensor_data + added)
                assert rest.get_model_metadata(PUBLIC)["name"] == PUBLIC
                config = rest.get_model_config(PUBLIC)
                assert config["name"] == PUBLIC
                assert [g["name"] for g in config["instance_group"]] == [f"{PUBLIC}_0"]
                assert rest.is_model_ready(PUBLIC) and rest.is_server_ready()
                stats = rest.get_inference_statistics(PUBLIC)["model_stats"]
                assert [s["name"] for s in stats] == [PUBLIC]
            with grpcclient.InferenceServerClient(proxy.grpc_url) as client:
                for tensor_data, compression in ((data, None), (data, "gzip"), (big, None)):
                    tensor = grpcclient.InferInput("INPUT0", list(tensor_data.shape), "FP32")
                    tensor.set_data_from_numpy(tensor_data)
                    result = client.infer(PUBLIC, [tensor], compression_algorithm=compression)
                    assert result.get_response().model_name == PUBLIC
                    assert np.array_equal(result.as_numpy("OUTPUT0"), tensor_data + added)
                assert client.get_model_metadata(PUBLIC).name == PUBLIC
                assert client.get_model_config(PUBLIC).config.name == PUBLIC
                assert client.is_model_ready(PUBLIC) and client.is_server_ready()
                stats = client.get_inference_statistics(PUBLIC).model_stats
                assert [s.name for s in stats] == [PUBLIC]
                with pytest.raises(InferenceServerException) as refused:
                    client.get_model_metadata(B_PRIVATE)
                assert unknown(B_PRIVATE) in str(refused.value)


def test_streams_name_the_public_id(gateway: RunningGateway, triton: TritonServer) -> None:
    settings = proxy_settings(
        triton,
        model_id="chat",
        triton_http_url=gateway.http_url,
        triton_grpc_url=gateway.grpc_url,
        source_address=POD_CHAT,
    )
    with running_proxy(settings) as proxy:
        results: list[object] = []
        with grpcclient.InferenceServerClient(proxy.grpc_url) as client:
            client.start_stream(callback=lambda result, error: results.append(error or result))
            for word, repeat in ((b"one", 3), (b"two", 2)):
                text = grpcclient.InferInput("text_input", [1], "BYTES")
                text.set_data_from_numpy(np.array([word], dtype=np.object_))
                count = grpcclient.InferInput("repeat", [1], "INT32")
                count.set_data_from_numpy(np.array([repeat], dtype=np.int32))
                client.async_stream_infer("chat", [text, count])
            client.stop_stream()  # waits for the stream's end
        assert len(results) == 5
        for result in results:
            assert not isinstance(result, InferenceServerException), result
            assert result.get_response().model_name == "chat"  # type: ignore[attr-defined]
        one = json.dumps({"text_input": "hi", "repeat": 1}).encode()
        status, _, answer = fetch(proxy.http_url, "POST", "/v2/models/chat/generate", one)
        assert status == 200 and json.loads(answer)["model_name"] == "chat", answer
        body = json.dumps({"text_input": "hi", "repeat": 3}).encode()
        status, _, events = fetch(proxy.http_url, "POST", "/v2/models/chat/generate_stream", body)
        assert status == 200 and no_private_name(events)
        data = [json.loads(line[5:]) for line in events.split(b"\n") if line.startswith(b"data:")]
        assert [d["text_output"] for d in data] == ["hi 0", "hi 1", "hi 2"]
        assert {d["model_name"] for d in data} == {"chat"}
