"""The REST relay's connection handling with raw sockets: pipelining, chunked bodies, refused
smuggling shapes, early answers, and a client that disconnects mid-request."""

from __future__ import annotations

import json
import socket
from dataclasses import replace

import pytest

from sim.triton import TritonServer
from tests.proxy.conftest import RunningProxy, proxy_settings, running_proxy, wait_until

pytestmark = pytest.mark.triton
INFER = json.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}
).encode()


def _connect(proxy: RunningProxy) -> socket.socket:
    host, port = proxy.http_url.split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _read_responses(sock: socket.socket, count: int) -> list[tuple[int, bytes]]:
    """Read `count` Content-Length-framed responses."""
    data = b""
    responses: list[tuple[int, bytes]] = []
    while len(responses) < count:
        head_end = data.find(b"\r\n\r\n")
        if head_end >= 0:
            head = data[:head_end].decode()
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.lower() == "content-length":
                    length = int(value)
            if len(data) >= head_end + 4 + length:
                responses.append((int(head.split()[1]), data[head_end + 4 : head_end + 4 + length]))
                data = data[head_end + 4 + length :]
                continue
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return responses


def _post(path: str, body: bytes, extra: bytes = b"") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n".encode()
        + extra
        + b"\r\n"
        + body
    )


def test_pipelined_requests_are_answered_in_order(proxy: RunningProxy) -> None:
    with _connect(proxy) as sock:
        sock.sendall(
            _post("/v2/models/add_one/infer", INFER)
            + b"GET /v2/models/identity/ready HTTP/1.1\r\nHost: t\r\n\r\n"
            + _post("/v2/repository/index", b"{}")
            + _post("/v2/models/add_one/infer", INFER)
            + b"GET /v2/models/add_one/ready HTTP/1.1\r\nHost: t\r\n\r\n"
        )
        responses = _read_responses(sock, 5)
    assert [status for status, _ in responses] == [200, 400, 403, 200, 200]
    assert json.loads(responses[0][1])["outputs"][0]["data"] == [2.0]


def test_a_chunked_request_body_is_relayed(proxy: RunningProxy) -> None:
    chunks = b"".join(
        f"{len(part):x}\r\n".encode() + part + b"\r\n"
        for part in (INFER[:10], INFER[10:40], INFER[40:])
    )
    with _connect(proxy) as sock:
        sock.sendall(
            b"POST /v2/models/add_one/infer HTTP/1.1\r\nHost: t\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"
        )
        sock.sendall(b"GET /v2/models/add_one/ready HTTP/1.1\r\nHost: t\r\n\r\n")
        responses = _read_responses(sock, 2)
    assert [status for status, _ in responses] == [200, 200]
    assert json.loads(responses[0][1])["outputs"][0]["data"] == [2.0]


@pytest.mark.parametrize(
    "request_bytes",
    [
        # The classic CL.TE smuggle: a hidden second request after a short chunked body.
        b"POST /v2/models/add_one/infer HTTP/1.1\r\nHost: t\r\nContent-Length: 60\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
        b"POST /v2/repository/index HTTP/1.1\r\nHost: t\r\n\r\n",
        b"POST /v2/models/add_one/infer HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n"
        b"Content-Length: 50\r\n\r\nhello",
        b"POST /v2/models/add_one/infer HTTP/1.1\r\nHost: t\r\nX: y\nContent-Length: 0\r\n\r\n",
    ],
)
def test_smuggling_shapes_are_refused_and_the_connection_closed(
    proxy: RunningProxy, request_bytes: bytes
) -> None:
    with _connect(proxy) as sock:
        sock.sendall(request_bytes)
        responses = _read_responses(sock, 2)
    assert [status for status, _ in responses] == [400]


def test_an_oversized_head_is_refused(proxy: RunningProxy) -> None:
    with _connect(proxy) as sock:
        sock.sendall(b"GET /v2 HTTP/1.1\r\nX: " + b"a" * 70_000 + b"\r\n\r\n")
        assert [status for status, _ in _read_responses(sock, 1)] == [431]


def test_a_request_head_sent_too_slowly_is_answered_408_and_closed(
    served_triton: TritonServer,
) -> None:
    settings = proxy_settings(served_triton, head_timeout_seconds=0.5)
    with running_proxy(settings) as running, _connect(running) as sock:
        # A complete request first: the timer only runs while a head is incomplete.
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\n\r\n")
        assert [status for status, _ in _read_responses(sock, 1)] == [200]
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\n")  # never finished
        responses = _read_responses(sock, 2)  # reads until the proxy closes
        assert [status for status, _ in responses] == [408]
        assert b"did not arrive within 0.5 s" in responses[0][1]


async def test_a_client_leaving_mid_request_frees_its_slot(served_triton: TritonServer) -> None:
    settings = proxy_settings(served_triton, model_id="sleepy", container_concurrency=1)
    body = json.dumps(
        {"inputs": [{"name": "DELAY_MS", "shape": [1], "datatype": "INT32", "data": [1000]}]}
    ).encode()
    with running_proxy(settings) as running:
        limiter = running.proxy.limiter
        sock = _connect(running)
        sock.sendall(_post("/v2/models/sleepy/infer", body))
        await wait_until(lambda: limiter.in_flight == 1, "the request taking its slot")
        sock.close()
        await wait_until(lambda: limiter.in_flight == 0, "the slot being freed")
        # A half-sent body that never completes also gives its slot back when the client leaves.
        sock = _connect(running)
        sock.sendall(_post("/v2/models/sleepy/infer", body)[:-5])
        await wait_until(lambda: limiter.in_flight == 1, "the partial request taking its slot")
        sock.close()
        await wait_until(lambda: limiter.in_flight == 0, "the partial request's slot being freed")


def test_an_unreachable_triton_is_a_clear_502_and_unavailable(
    served_triton: TritonServer, grpc_mode: str
) -> None:
    import grpc
    from tritonclient.grpc import service_pb2

    # A port held and never listened on: connections to it are refused, and no other process of
    # the machine (another test's server on a free port) can take it meanwhile.
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    down = f"127.0.0.1:{holder.getsockname()[1]}"
    settings = replace(
        proxy_settings(served_triton, grpc_mode=grpc_mode),
        triton_http_url=down,
        triton_grpc_url=down,
        connect_retry_seconds=0.0,  # at once: waiting for it to listen is test_upstream_restart's
    )
    with holder, running_proxy(settings) as running:
        with _connect(running) as sock:
            sock.sendall(_post("/v2/models/add_one/infer", INFER))
            [(status, body)] = _read_responses(sock, 1)
        assert status == 502
        assert f"Triton at {down} is unreachable" in json.loads(body)["error"]
        assert running.proxy.limiter.in_flight == 0
        with grpc.insecure_channel(running.grpc_url) as channel:
            request = service_pb2.ModelInferRequest(model_name="add_one").SerializeToString()
            with pytest.raises(grpc.RpcError) as caught:
                channel.unary_unary("/inference.GRPCInferenceService/ModelInfer", None, None)(
                    request, timeout=10
                )
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


def test_expect_100_continue_is_relayed_before_the_body(proxy: RunningProxy) -> None:
    with _connect(proxy) as sock:
        head = _post("/v2/models/add_one/infer", INFER, b"Expect: 100-continue\r\n")
        sock.sendall(head[: -len(INFER)])
        interim = b""
        while b"\r\n\r\n" not in interim:
            chunk = sock.recv(1024)
            assert chunk, "the connection closed before the interim answer"
            interim += chunk
        assert interim.startswith(b"HTTP/1.1 100")
        sock.sendall(INFER)
        rest = interim.split(b"\r\n\r\n", 1)[1]
        assert rest == b""
        [(status, body)] = _read_responses(sock, 1)
    assert status == 200
    assert json.loads(body)["outputs"][0]["data"] == [2.0]
