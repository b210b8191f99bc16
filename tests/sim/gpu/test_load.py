"""The simulated GPUs' model memory (sim/gpu/load.py): when the API server is away the GPUs keep
their last state, as a real GPU's memory does not depend on it, so the agent reading the mock
NVML sees no error of the API server's; a TritonModel replica holds its model's declared
footprint on the GPU its model's status places it."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest

from common.tritonname import private_triton_name
from sim.apiserver import ApiServerSettings, start_in_thread
from sim.gpu.load import ModelFootprints
from tests.deploy.rendering import CHART

MODELS = ("tritonshare.io", "v1alpha1", "tritonmodels")


class _Index(BaseHTTPRequestHandler):
    """Triton's repository index, with nothing loaded."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"[]")

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def triton() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_an_unreachable_api_server_leaves_the_memory_as_it_was(tmp_path: Path, triton: str) -> None:
    configuration = kubernetes.client.Configuration()
    holder = socket.socket()  # held, never listened on: refused, and no other server takes it
    holder.bind(("127.0.0.1", 0))
    configuration.host = f"http://127.0.0.1:{holder.getsockname()[1]}"
    configuration.retries = 0
    api = kubernetes.client.ApiClient(configuration)
    try:
        footprints = ModelFootprints(triton, tmp_path, api, "node-a", {"GPU-0": 0}, cache_seconds=0)
        footprints._cached = (-1e9, {0: 1 << 30})  # what it last read
        assert footprints() == {0: 1 << 30}
    finally:
        api.close()  # type: ignore[no-untyped-call]
        holder.close()


class _Ready(BaseHTTPRequestHandler):
    """Triton's repository index, with `names` READY."""

    names: tuple[str, ...] = ()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.dumps([{"name": n, "state": "READY"} for n in self.names]).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_a_tritonmodel_replica_holds_its_declared_memory_on_the_gpu_its_status_places_it(
    tmp_path: Path,
) -> None:
    """A replica has no pod of its own: its GPU is its model's status.placements'."""
    server = start_in_thread(settings=ApiServerSettings(crds=(CHART / "crds",)))
    api = server.api_client()
    custom: Any = kubernetes.client.CustomObjectsApi(api)
    core: Any = kubernetes.client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": "team-a"}})
    body = {"apiVersion": "tritonshare.io/v1alpha1", "kind": "TritonModel",
            "metadata": {"name": "bert"}, "spec": {"storageUri": "s3://b/bert"}}  # fmt: skip
    model = custom.create_namespaced_custom_object(*MODELS[:2], "team-a", MODELS[2], body)
    placements = [{"replica": 1, "node": "node-a", "gpu": "GPU-1"}]
    custom.patch_namespaced_custom_object_status(
        *MODELS[:2], "team-a", MODELS[2], "bert", {"status": {"placements": placements}}
    )
    name = private_triton_name("team-a", "bert", f"{model['metadata']['uid']}/1")
    (tmp_path / name).mkdir()
    (tmp_path / name / "config.pbtxt").write_text(
        'backend: "onnxruntime"\n'
        'parameters { key: "sim_gpu_memory" value: { string_value: "3Gi" } }\n'
    )
    handler = type("Ready", (_Ready,), {"names": (name,)})
    triton = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=triton.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"127.0.0.1:{triton.server_address[1]}"
        gpus = {"GPU-0": 0, "GPU-1": 1}
        footprints = ModelFootprints(url, tmp_path, api, "node-a", gpus, cache_seconds=0)
        assert footprints() == {1: 3 << 30}
    finally:
        triton.shutdown()
        triton.server_close()
        thread.join(timeout=5)
        api.close()  # type: ignore[no-untyped-call]
        server.stop()
