"""The real-Triton fixture really serves inferences (HTTP and gRPC) and stops cleanly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import psutil
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

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
