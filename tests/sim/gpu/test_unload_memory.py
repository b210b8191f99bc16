"""A simulated GPU keeps a model's memory until Triton has unloaded it (sim/gpu/load.py), as a
real GPU does: not until its pod object or its files are gone. A pod deleted while Triton still
unloads its model (a long queue, a slow finalize) leaves the model's bytes on its GPU until the
index says the unload has finished."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest

from sim.gpu.load import ModelFootprints

GI = 1 << 30


class FakeIndex:
    """Triton's repository index, with the states a test sets."""

    def __init__(self) -> None:
        self.states: dict[str, str] = {}
        index = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.dumps([{"name": n, "state": s} for n, s in index.states.items()])
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def index() -> Iterator[FakeIndex]:
    fake = FakeIndex()
    thread = threading.Thread(target=fake.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        fake.server.shutdown()
        fake.server.server_close()
        thread.join(timeout=5)


def model_files(repository: Path, name: str, uses: str) -> None:
    (repository / name).mkdir(parents=True)
    (repository / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "onnxruntime"\n'
        f'parameters {{ key: "sim_gpu_memory" value: {{ string_value: "{uses}" }} }}\n'
    )


def model_pod(api: kubernetes.client.ApiClient, name: str, gpu: str) -> None:
    core: Any = kubernetes.client.CoreV1Api(api)
    annotations = {"tritonshare.io/model-id": name, "tritonshare.io/gpu": gpu}
    core.create_namespaced_pod(
        "default",
        {
            "metadata": {"name": name, "annotations": annotations},
            "spec": {"nodeName": "node-a", "containers": [{"name": "proxy", "image": "p"}]},
        },
    )


def test_a_deleted_pod_s_model_holds_its_gpu_memory_until_triton_has_unloaded_it(
    tmp_path: Path, index: FakeIndex, kube_api: kubernetes.client.ApiClient
) -> None:
    footprints = ModelFootprints(
        index.url, tmp_path, kube_api, "node-a", {"GPU-0": 0, "GPU-1": 1}, cache_seconds=0
    )
    model_files(tmp_path, "big", "10Gi")
    model_pod(kube_api, "big", "GPU-1")
    index.states["big"] = "READY"
    assert footprints() == {1: 10 * GI}

    # The pod is gone, its files removed, while Triton still unloads the model.
    index.states["big"] = "UNLOADING"
    core: Any = kubernetes.client.CoreV1Api(kube_api)
    core.delete_namespaced_pod("big", "default", grace_period_seconds=0)
    (tmp_path / "big" / "config.pbtxt").unlink()
    assert footprints() == {1: 10 * GI}, "held until the unload has finished"

    index.states["big"] = "UNAVAILABLE"
    assert footprints() == {}
    index.states["big"] = "LOADING"  # loaded again with no pod nor files: nothing known of it
    assert footprints() == {}
