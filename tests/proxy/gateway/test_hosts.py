"""A model host through the node gateway, with a real Triton: one address, several models.

The host of namespace team-h serves replicas of `a` (add_one) and `b` (the same model adding
ten), each under its own private name in Triton; a host of team-o, at another address, serves
`c`. Triton also has models under the public ids `a` and `b` themselves (adding a hundred and
a thousand: other pods', installed before private names), so a request that reached Triton
under a public id would show. Attacks first: the host names another namespace's model, its own
models' private names, its neighbour's, over REST and gRPC (unary, compressed, large, a stream
switching models) and must get what it gets for a model Triton does not have, with no answer
ever carrying a private name; then the service: each of its models under its public id, on one
connection, each with its own limit and quarantine, and the table changing under open
connections.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from common.activity import ActivityTableError
from common.activity import read_table as read_activity
from common.callers import Caller
from proxy.gateway.tenants import members
from proxy.gateway.witness import suspects_of
from sim.triton import TritonInstall, TritonServer
from tests.conftest import copy_model
from tests.proxy.gateway.conftest import (
    RunningGateway,
    gateway_settings,
    publish,
    running_gateway,
)
from tests.proxy.gateway.test_private_names import _load, fetch, grpc_call, infer_request
from tests.proxy.gateway.test_private_names import unknown as unknown_to_a_pod


def unknown(name: str) -> str:
    """The gateway's refusal of a model its caller, the host, does not serve."""
    return unknown_to_a_pod(name, "").replace(
        "is not found", "is not found; this host serves 'a', 'b', 'm'"
    )


pytestmark = pytest.mark.triton

A_PRIVATE = "team-h.a.0a0a0a0a"
B_PRIVATE = "team-h.b.0b0b0b0b"
C_PRIVATE = "team-o.c.0c0c0c0c"
M_PRIVATE = "team-h.m.0d0d0d0d"
"""The private name of a replica the host serves but Triton does not have (lost, or loading)."""
PRIVATE_NAMES = (A_PRIVATE, B_PRIVATE, C_PRIVATE, M_PRIVATE)
HOST, OTHER = "127.1.3.1", "127.1.3.2"
HOST_POD = "team-h/tritonshare-host-0123456789abcdef"
INFER = json.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}
).encode()


def row(model: str, private: str, *, quarantined: str = "", concurrency: int = 0) -> Caller:
    """The host's row for its replica of `model`, as the agent writes it."""
    return Caller(HOST, model, HOST_POD, f"uid-{model}/0", concurrency, private, quarantined)


OTHER_ROW = Caller(OTHER, "c", "team-o/tritonshare-host-0123456789abcdef", "uid-c/0", 0, C_PRIVATE)
"""Team-o's host's replica of `c`."""
ROWS = (row("a", A_PRIVATE, concurrency=2), row("b", B_PRIVATE), row("m", M_PRIVATE), OTHER_ROW)


def _adding(triton_repository: Path, name: str, amount: int) -> None:
    model = copy_model("add_one", triton_repository, as_name=name) / "1" / "model.py"
    model.write_text(model.read_text().replace("(data + 1)", f"(data + {amount})"))


@pytest.fixture(scope="module")
def triton(
    tmp_path_factory: pytest.TempPathFactory, triton_install: TritonInstall
) -> Iterator[TritonServer]:
    repository = tmp_path_factory.mktemp("host-models")
    copy_model("add_one", repository, as_name=A_PRIVATE)
    _adding(repository, B_PRIVATE, 10)
    copy_model("add_one", repository, as_name=C_PRIVATE)
    _adding(repository, "a", 100)
    _adding(repository, "b", 1000)
    server = TritonServer(repository)
    server.start()
    try:
        for name in (A_PRIVATE, B_PRIVATE, C_PRIVATE, "a", "b"):
            _load(server, name)
        yield server
    finally:
        server.discard()


@pytest.fixture(scope="module")
def gateway(
    triton: TritonServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningGateway]:
    table = tmp_path_factory.mktemp("host-gateway") / "callers.json"
    publish(table, *ROWS)
    with running_gateway(gateway_settings(triton, table, table_max_age_seconds=3600)) as running:
        yield running


@pytest.fixture
def changing(triton: TritonServer, tmp_path: Path) -> Iterator[tuple[RunningGateway, Path]]:
    """A gateway of its own, for a test that changes the caller table."""
    table = tmp_path / "callers.json"
    publish(table, *ROWS)
    with running_gateway(gateway_settings(triton, table, table_max_age_seconds=3600)) as running:
        yield running, table


def no_private_name(data: bytes) -> bool:
    return not any(name.encode() in data for name in PRIVATE_NAMES)


def rest_output(body: bytes) -> list[float]:
    answer = json.loads(body)
    assert answer["model_name"] in ("a", "b", "c"), answer
    return [float(x) for x in answer["outputs"][0]["data"]]


def grpc_output(answer: bytes) -> list[float]:
    response = service_pb2.ModelInferResponse.FromString(answer)
    values: list[float] = np.frombuffer(response.raw_output_contents[0], dtype=np.float32).tolist()
    return values


def poll(check: object, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, http.client.HTTPException):
            if callable(check) and check():
                return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


# -- attacks -------------------------------------------------------------------------------------

PER_MODEL = [
    ("POST", "/v2/models/{m}/infer"),
    ("GET", "/v2/models/{m}"),
    ("GET", "/v2/models/{m}/ready"),
    ("GET", "/v2/models/{m}/config"),
    ("GET", "/v2/models/{m}/stats"),
]


@pytest.mark.parametrize(("method", "path"), PER_MODEL)
@pytest.mark.parametrize("name", ["c", C_PRIVATE, A_PRIVATE, B_PRIVATE, "A", "a.", "ghost"])
def test_rest_a_host_reaches_no_model_but_its_own_under_their_ids(
    gateway: RunningGateway, triton: TritonServer, method: str, path: str, name: str
) -> None:
    body = INFER if method == "POST" else None
    # Triton has it (but `ghost`, `A` and `a.`): only the gateway stands between the host and it.
    ghost = fetch(gateway.http_url, method, path.format(m="ghost"), body, HOST)
    answer = fetch(gateway.http_url, method, path.format(m=name), body, HOST)
    assert answer == (ghost[0], ghost[1], ghost[2].replace(b"'ghost'", f"'{name}'".encode()))
    assert answer[0] >= 400 and no_private_name(answer[2].replace(name.encode(), b""))


def test_rest_a_host_reaches_each_of_its_models_under_its_public_id_on_one_connection(
    gateway: RunningGateway,
) -> None:
    host, port = gateway.http_url.split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30, source_address=(HOST, 0))
    try:
        # One keep-alive connection, its models in turn: each request mapped and renamed alone.
        for model, added in (("a", 1), ("b", 10), ("a", 1), ("b", 10)):
            connection.request("POST", f"/v2/models/{model}/infer", body=INFER)
            response = connection.getresponse()
            body = response.read()
            assert response.status == 200 and no_private_name(body), body
            assert json.loads(body)["model_name"] == model
            assert rest_output(body) == [1 + added, 2 + added, 3 + added]
        for model in ("b", "a"):
            for suffix in ("", "/config", "/stats", "/ready"):
                connection.request("GET", f"/v2/models/{model}{suffix}")
                response = connection.getresponse()
                body = response.read()
                assert response.status == 200 and no_private_name(body), (suffix, body)
                if suffix in ("", "/config"):
                    assert json.loads(body)["name"] == model
                if suffix == "/stats":
                    assert [m["name"] for m in json.loads(body)["model_stats"]] == [model]
    finally:
        connection.close()


def test_each_of_a_hosts_models_has_its_own_limit(gateway: RunningGateway) -> None:
    assert fetch(gateway.http_url, "GET", "/v2/models/b/ready", None, HOST)[0] == 200
    tenant = next(t for t in gateway.gateway.tenants if t.caller.address == HOST)
    a, b = tenant.members["a"].limiter, tenant.members["b"].limiter
    default = gateway.settings.max_in_flight_per_pod
    assert tenant.host and (a.own_limit, b.own_limit) == (2, default)
    assert len({id(a), id(b), id(tenant.limiter)}) == 3


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/v2/models/stats", 400),  # every model's statistics would name the node's others
        ("/v2/repository/index", 403),
        ("/v2/models/a/trace/setting", 403),
        ("/v2/models/a/../b/ready", 404),
        ("/v2/models/a%2F..%2Fteam-o.c.0c0c0c0c/ready", 400),
    ],
)
def test_rest_server_wide_and_crafted_paths_reach_no_other_model(
    gateway: RunningGateway, path: str, status: int
) -> None:
    method = "POST" if path.startswith("/v2/repository") else "GET"
    answer = fetch(gateway.http_url, method, path, None, HOST)
    assert answer[0] == status and no_private_name(answer[2]), answer


@pytest.mark.parametrize("encoding", ["identity", "gzip"])
@pytest.mark.parametrize("name", ["c", C_PRIVATE, A_PRIVATE, B_PRIVATE])
def test_grpc_a_host_reaches_no_model_but_its_own(
    gateway: RunningGateway, name: str, encoding: str
) -> None:
    fields, answers = grpc_call(
        gateway.grpc_url, HOST, "ModelInfer", [infer_request(name)], encoding
    )
    assert (fields.get("grpc-status"), fields.get("grpc-message")) == ("5", unknown(name))
    assert answers == []
    named = service_pb2.ModelMetadataRequest(name=name).SerializeToString()
    for method in ("ModelMetadata", "ModelConfig"):
        fields, answers = grpc_call(gateway.grpc_url, HOST, method, [named], encoding)
        assert fields.get("grpc-status") == "5" and answers == [], (method, fields)
    fields, answers = grpc_call(gateway.grpc_url, HOST, "ModelReady", [named], encoding)
    assert fields.get("grpc-status") == "0"
    assert not service_pb2.ModelReadyResponse.FromString(answers[0]).ready


@pytest.mark.parametrize("floats", [3, 8192], ids=["small", "large"])
@pytest.mark.parametrize("model", ["a", "b"])
def test_grpc_a_host_reaches_each_of_its_models_under_its_public_id(
    gateway: RunningGateway, model: str, floats: int
) -> None:
    added = {"a": 1, "b": 10}[model]
    fields, answers = grpc_call(
        gateway.grpc_url, HOST, "ModelInfer", [infer_request(model, floats=floats)]
    )
    assert fields.get("grpc-status") == "0", fields
    response = service_pb2.ModelInferResponse.FromString(answers[0])
    assert response.model_name == model and no_private_name(answers[0])
    assert grpc_output(answers[0]) == [float(i + added) for i in range(floats)]
    named = service_pb2.ModelMetadataRequest(name=model).SerializeToString()
    for method in ("ModelMetadata", "ModelConfig", "ModelStatistics"):
        fields, answers = grpc_call(gateway.grpc_url, HOST, method, [named])
        assert fields.get("grpc-status") == "0" and no_private_name(answers[0]), method
    metadata = grpc_call(gateway.grpc_url, HOST, "ModelMetadata", [named])[1][0]
    assert service_pb2.ModelMetadataResponse.FromString(metadata).name == model


def test_grpc_statistics_of_every_model_are_refused(gateway: RunningGateway) -> None:
    fields, answers = grpc_call(gateway.grpc_url, HOST, "ModelStatistics", [b""])
    assert fields.get("grpc-status") == "3" and answers == []


@pytest.mark.parametrize("floats", [8192, 400_000], ids=["held-whole", "in-pieces"])
def test_grpc_a_message_naming_its_model_last_is_renamed_or_refused(
    gateway: RunningGateway, floats: int
) -> None:
    # A message held whole is renamed wherever its name is; one relayed in pieces is renamed
    # as it passes, so its name must come first, as serializers write it.
    request = service_pb2.ModelInferRequest.FromString(infer_request("b", floats=floats))
    name = service_pb2.ModelInferRequest(model_name="b").SerializeToString()
    reordered = request.SerializePartialToString().replace(name, b"", 1) + name
    fields, answers = grpc_call(gateway.grpc_url, HOST, "ModelInfer", [reordered])
    if floats == 8192:
        assert fields.get("grpc-status") == "0", fields
        assert no_private_name(answers[0])
        assert grpc_output(answers[0]) == [float(i + 10) for i in range(floats)]
    else:
        assert fields.get("grpc-status") == "3" and answers == [], fields
        assert "first field" in fields.get("grpc-message", "")


def test_grpc_a_stream_serves_the_model_its_first_message_names(gateway: RunningGateway) -> None:
    messages = [infer_request("a"), infer_request("b"), infer_request(B_PRIVATE)]
    messages += [infer_request("c"), infer_request("a")]
    fields, answers = grpc_call(gateway.grpc_url, HOST, "ModelStreamInfer", messages)
    assert fields.get("grpc-status") == "0", fields
    responses = [service_pb2.ModelStreamInferResponse.FromString(a) for a in answers]
    assert len(responses) == 5
    # No answer names a private name but the refusal echoing the one the host sent.
    echoed = unknown(B_PRIVATE).encode()
    assert all(no_private_name(a.replace(echoed, b"")) for a in answers)
    served = [r for r in responses if not r.error_message]
    refused = [r.error_message for r in responses if r.error_message]
    assert [r.infer_response.model_name for r in served] == ["a", "a"]
    for response in served:
        output = response.infer_response.SerializeToString()
        assert grpc_output(output) == [1.0, 2.0, 3.0], "a's replica, not Triton's model `a`"
    assert (
        refused[0]
        == "this stream serves model a, which its first message named; open a stream per model"
    )
    assert refused[1:] == [unknown(B_PRIVATE), unknown("c")]


def _runs(triton: TritonServer, model: str) -> int:
    """How many inferences Triton has run for `model` (its statistics)."""
    url = f"http://{triton.http_url}/v2/models/{model}/stats"
    with urllib.request.urlopen(url, timeout=10) as answer:
        stats = json.loads(answer.read())
    return int(stats["model_stats"][0]["inference_stats"]["success"]["count"])


def test_a_large_stream_message_naming_another_model_last_never_reaches_triton(
    changing: tuple[RunningGateway, Path], triton: TritonServer
) -> None:
    # The host's replica of `a` is Triton's `a` itself (installed before private names); its
    # stream may not pass a message for `b` to Triton under b's public id (another's model there)
    # by hiding the name past the part of the message the gateway decides from.
    gateway, table = changing
    publish(table, row("a", ""), row("b", B_PRIVATE), OTHER_ROW)

    def legacy() -> bool:  # the host's `a` is Triton's `a` now
        answer = fetch(gateway.http_url, "POST", "/v2/models/a/infer", INFER, HOST)
        return answer[0] == 200 and rest_output(answer[2]) == [101.0, 102.0, 103.0]

    poll(legacy, "the gateway rereading")
    runs_of_b = _runs(triton, "b")
    request = service_pb2.ModelInferRequest.FromString(infer_request("b", floats=400_000))
    name = service_pb2.ModelInferRequest(model_name="b").SerializeToString()
    hidden = request.SerializePartialToString().replace(name, b"", 1) + name
    fields, answers = grpc_call(
        gateway.grpc_url, HOST, "ModelStreamInfer", [infer_request("a"), hidden]
    )
    responses = [service_pb2.ModelStreamInferResponse.FromString(a) for a in answers]
    outputs = [
        grpc_output(r.infer_response.SerializeToString()) for r in responses if not r.error_message
    ]
    # a's answer may still be on its way from Triton when the gateway ends the stream.
    assert outputs in ([], [[100.0, 101.0, 102.0]]), "a's answer only"
    assert _runs(triton, "b") == runs_of_b, "Triton never ran b's message"
    assert fields.get("grpc-status") == "3", fields
    assert "this stream serves model a" in fields.get("grpc-message", "")


def test_tritons_errors_for_a_replica_name_its_public_id(gateway: RunningGateway) -> None:
    # Triton lacks m's replica: its own errors quote the private name, the host gets the id.
    for method, path in PER_MODEL:
        body = INFER if method == "POST" else None
        ghost = fetch(gateway.http_url, method, path.format(m="ghost"), body, HOST)
        answer = fetch(gateway.http_url, method, path.format(m="m"), body, HOST)
        assert no_private_name(answer[2]) and answer[0] >= 400, (path, answer)
        if path.endswith("infer") or path == "/v2/models/{m}":
            assert b"'m'" in answer[2] and answer[0] == ghost[0], (path, answer)
    fields, answers = grpc_call(gateway.grpc_url, HOST, "ModelInfer", [infer_request("m")])
    assert fields.get("grpc-status") != "0" and answers == []
    assert "'m'" in fields.get("grpc-message", "") and M_PRIVATE not in str(fields)
    fields, answers = grpc_call(
        gateway.grpc_url, HOST, "ModelStreamInfer", [infer_request("m"), infer_request("a")]
    )
    assert all(no_private_name(a) for a in answers) and M_PRIVATE not in str(fields)
    errors = [service_pb2.ModelStreamInferResponse.FromString(a).error_message for a in answers]
    assert any("'m'" in e for e in errors), errors


def test_another_namespaces_host_reaches_its_own_model_only(gateway: RunningGateway) -> None:
    status, _, body = fetch(gateway.http_url, "POST", "/v2/models/c/infer", INFER, OTHER)
    assert status == 200 and rest_output(body) == [2.0, 3.0, 4.0] and no_private_name(body)
    for model in ("a", "b"):
        assert fetch(gateway.http_url, "GET", f"/v2/models/{model}/ready", None, OTHER)[0] == 400


# -- the table changing under a host's open connections --------------------------------------------


def test_a_quarantined_replica_is_refused_and_the_others_served(
    changing: tuple[RunningGateway, Path],
) -> None:
    gateway, table = changing
    host, port = gateway.http_url.split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30, source_address=(HOST, 0))

    def infer(model: str) -> tuple[int, bytes]:
        connection.request("POST", f"/v2/models/{model}/infer", body=INFER)
        response = connection.getresponse()
        return response.status, response.read()

    try:
        assert infer("a")[0] == 200 and infer("b")[0] == 200
        words = "model a is quarantined on this node: ask the operator"
        publish(table, row("a", A_PRIVATE, quarantined=words), *ROWS[1:])
        poll(lambda: infer("a")[0] != 200, "the gateway rereading")
        status, body = infer("a")
        assert status == 503 and words in body.decode(), body
        # The same connection goes on serving the host's other model.
        status, body = infer("b")
        assert status == 200 and rest_output(body) == [11.0, 12.0, 13.0]
        fields, _ = grpc_call(gateway.grpc_url, HOST, "ModelInfer", [infer_request("a")])
        assert words in fields.get("grpc-message", "") and fields.get("grpc-status") != "0"
        assert (
            grpc_call(gateway.grpc_url, HOST, "ModelInfer", [infer_request("b")])[0].get(
                "grpc-status"
            )
            == "0"
        )
    finally:
        connection.close()


def test_a_replica_leaving_keeps_the_hosts_other_models_and_the_last_drops_it(
    changing: tuple[RunningGateway, Path],
) -> None:
    gateway, table = changing
    host, port = gateway.http_url.split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30, source_address=(HOST, 0))

    def ready(model: str) -> int:
        connection.request("GET", f"/v2/models/{model}/ready")
        response = connection.getresponse()
        response.read()
        return response.status

    try:
        assert ready("a") == 200 and ready("b") == 200
        publish(table, ROWS[0], OTHER_ROW)  # b's replica left the host
        poll(lambda: ready("b") == 400, "b refused")
        assert ready("a") == 200, "the host's connection stays for its other model"
        publish(table, row("b", B_PRIVATE), ROWS[0], OTHER_ROW)  # and came back
        poll(lambda: ready("b") == 200, "b served again")
        publish(table, OTHER_ROW)  # the host lost every replica: its connections are dropped
        with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                ready("a")
                time.sleep(0.02)
    finally:
        connection.close()
    assert fetch(gateway.http_url, "GET", "/v2/models/c/ready", None, OTHER)[0] == 200


# -- what the node reads of a host's models: metrics, activity, the crash witness ----------------


def test_a_hosts_models_are_counted_each_under_its_own_row(gateway: RunningGateway) -> None:
    for model in ("a", "b"):
        assert fetch(gateway.http_url, "POST", f"/v2/models/{model}/infer", INFER, HOST)[0] == 200
    with urllib.request.urlopen(gateway.metrics_url, timeout=30) as response:
        exposition = response.read().decode()
    for model in ("a", "b"):
        labelled = [
            line
            for line in exposition.splitlines()
            if f'model="{model}"' in line and f'pod="{HOST_POD}"' in line
        ]
        assert labelled, f"no series of {model} under the host's pod"

    # The agent's evictions read each replica's activity by its name in Triton.
    def named() -> set[str]:
        try:
            return set(read_activity(gateway.settings.activity_path).models)
        except ActivityTableError:
            return set()  # not written yet

    poll(lambda: {A_PRIVATE, B_PRIVATE} <= named(), "the activity table naming both replicas")
    # The crash witness names the replica, by its uid, not the host as a whole (the last sender
    # alone here: no sender counts as just before).
    rows = [m for m in members(gateway.gateway.tenants) if m.caller.address == HOST]
    assert sorted(m.caller.uid for m in rows) == ["uid-a/0", "uid-b/0", "uid-m/0"]
    suspects = suspects_of(rows, {}, time.monotonic(), last=60.0, beside=0.0)
    assert [(s.pod, s.uid, s.model_id) for s in suspects] == [(HOST_POD, "uid-b/0", "b")]
