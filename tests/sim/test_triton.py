"""The real-Triton fixture really serves inferences (HTTP and gRPC) and stops cleanly."""

from __future__ import annotations

import socket
import time
import urllib.request
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from sim.crashers import load_killer
from sim.triton import TritonInstall, TritonServer
from tests.conftest import copy_model


def test_fixture_serves_an_inference_over_http_and_grpc(
    triton: TritonServer, model_repository: Path
) -> None:
    copy_model("add_one", model_repository)
    http = httpclient.InferenceServerClient(triton.http_url)
    try:
        assert http.is_server_live()
        http.load_model("add_one")
        assert http.is_model_ready("add_one")
        data = np.array([[1.0, 2.5, -3.0]], dtype=np.float32)
        inp = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
        inp.set_data_from_numpy(data)
        result = http.infer("add_one", [inp])
        np.testing.assert_allclose(result.as_numpy("OUTPUT0"), data + 1)
    finally:
        http.close()

    grpc = grpcclient.InferenceServerClient(triton.grpc_url)
    try:
        ginp = grpcclient.InferInput("INPUT0", [1, 2], "FP32")
        ginp.set_data_from_numpy(np.array([[10.0, 20.0]], dtype=np.float32))
        gres = grpc.infer("add_one", [ginp])
        np.testing.assert_allclose(gres.as_numpy("OUTPUT0"), [[11.0, 21.0]])
    finally:
        grpc.close()


def test_identity_echoes_several_dtypes(triton: TritonServer, model_repository: Path) -> None:
    copy_model("identity", model_repository)
    client = httpclient.InferenceServerClient(triton.http_url)
    try:
        client.load_model("identity")
        ints = np.array([1, -2, 3], dtype=np.int64)
        words = np.array([b"a", b"bc", "é".encode()], dtype=np.object_)
        i1 = httpclient.InferInput("INPUT_INT64", [3], "INT64")
        i1.set_data_from_numpy(ints)
        i2 = httpclient.InferInput("INPUT_BYTES", [3], "BYTES")
        i2.set_data_from_numpy(words)
        result = client.infer("identity", [i1, i2])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT_INT64"), ints)
        assert list(result.as_numpy("OUTPUT_BYTES")) == list(words)
    finally:
        client.close()


def test_stop_ends_the_process(triton_install: TritonInstall, model_repository: Path) -> None:
    server = TritonServer(model_repository).start()
    process = server.process
    assert process is not None and process.poll() is None
    server.stop()
    assert process.poll() is not None


def test_discard_kills_the_server_and_its_stubs_and_removes_their_shared_memory(
    triton_install: TritonInstall, model_repository: Path
) -> None:
    copy_model("add_one", model_repository)
    server = TritonServer(model_repository).start()
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        client.load_model("add_one")  # a Python-backend model: a stub and its shm regions
    finally:
        client.close()
    shm = Path("/dev/shm")
    regions = list(shm.glob(f"{server.shm_prefix}*"))
    assert regions, "the Python backend made no shared-memory region under the server's prefix"
    assert server.process is not None
    process = psutil.Process(server.process.pid)
    group = [process, *process.children(recursive=True)]
    assert any("stub" in " ".join(p.cmdline()) for p in group[1:]), "no backend stub running"
    server.discard()
    assert not [p for p in regions if p.exists()], "regions left in /dev/shm"
    # SIGKILL went to the whole group; the stubs end a moment later (init reaps them).
    _, alive = psutil.wait_procs(group, timeout=10)
    assert not [p.pid for p in alive if p.status() != psutil.STATUS_ZOMBIE]


def test_a_crashed_server_takes_its_stubs_and_its_sockets_with_it_at_once(
    triton_install: TritonInstall, model_repository: Path
) -> None:
    """As a container runtime ends a container's processes when its main one exits: a backend
    stub would otherwise keep the sockets it inherited (a watcher's connection, the listening
    ports) open, and nobody watching Triton's port would see it die until the restart."""
    model = copy_model("add_one", model_repository, as_name="killer")
    (model / "1" / "model.py").write_text(load_killer())
    server = TritonServer(model_repository).start()
    try:
        # Open before the load: the killer's stub, started by the load, inherits it.
        watcher = socket.create_connection(("127.0.0.1", server.http_port))
        watcher.settimeout(5.0)
        load = urllib.request.Request(
            f"http://{server.http_url}/v2/repository/models/killer/load", method="POST"
        )
        with pytest.raises(OSError):  # Triton dies under the load
            urllib.request.urlopen(load, timeout=30)
        assert server.process is not None
        server.process.wait(10)
        assert watcher.recv(1) == b"", "the watcher's connection is still open"
        deadline = time.monotonic() + 5.0
        refused = False
        while not refused and time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", server.http_port), timeout=0.5).close()
                time.sleep(0.05)
            except ConnectionRefusedError:
                refused = True
        assert refused, "something still listens on the dead server's port"
        watcher.close()
    finally:
        server.discard()


def test_a_kept_server_is_started_again_at_once_after_a_crash_and_stops_whole(
    triton_install: TritonInstall, model_repository: Path
) -> None:
    """As the node pod's Triton container runs it: a model that kills Triton as it loads costs
    seconds, not the kubelet's back-off; the server serves again, and its stop ends every process
    of the container."""
    killer = copy_model("add_one", model_repository, as_name="killer")
    (killer / "1" / "model.py").write_text(load_killer())
    copy_model("add_one", model_repository)
    server = TritonServer(model_repository, kept=True).start()
    try:
        assert server.process is not None
        keeper = psutil.Process(server.process.pid)

        def serving() -> bool:
            try:
                with urllib.request.urlopen(f"http://{server.http_url}/v2/health/live", timeout=1):
                    return True
            except OSError:
                return False

        for exits in (1, 2):
            load = urllib.request.Request(
                f"http://{server.http_url}/v2/repository/models/killer/load", method="POST"
            )
            with pytest.raises(OSError):  # Triton dies under the load
                urllib.request.urlopen(load, timeout=30)
            started = time.monotonic()
            deadline = started + 30
            while not serving():
                assert time.monotonic() < deadline, f"not serving 30 s after exit {exits}"
                time.sleep(0.05)
            assert not server.exited(), "the keeper exited"
            assert server.kept_exits() == exits
        client = httpclient.InferenceServerClient(server.http_url)
        try:
            client.load_model("add_one")
            assert client.is_model_ready("add_one")
        finally:
            client.close()
        group = [keeper, *keeper.children(recursive=True)]
        assert len(group) >= 3  # the keeper, the server and add_one's stub
    finally:
        server.stop()
    _, alive = psutil.wait_procs(group, timeout=20)
    assert not [p.pid for p in alive if p.status() != psutil.STATUS_ZOMBIE]
