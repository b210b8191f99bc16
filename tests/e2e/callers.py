"""A model's steady caller through its Service for the end-to-end tests: one request at a time,
REST on a keep-alive connection or gRPC on a long-lived channel, every answer kept with its times,
so a test can say which requests failed while the cluster changed shape."""

from __future__ import annotations

import http.client
import json
import threading
import time
from dataclasses import dataclass

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

DEADLINE = 10.0
"""Seconds a request may take before it counts as failed (no answer)."""
CLIENT_INTERVAL = 0.1
"""Seconds between a caller's requests."""
BODY = json.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}
).encode()


@dataclass(frozen=True)
class Request:
    model: str
    protocol: str
    start: float
    end: float
    ok: bool
    detail: str = ""


class Client:
    """One model's caller through its Service, one request at a time, every answer kept."""

    def __init__(self, model: str, protocol: str, address: str, log: list[Request]) -> None:
        self.model, self.protocol, self.address = model, protocol, address
        self.log = log
        self.active = threading.Event()
        self.active.set()
        self.answered = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"client-{model}-{protocol}")
        self._http: http.client.HTTPConnection | None = None
        self._grpc: grpcclient.InferenceServerClient | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(DEADLINE + 5)
        if self._http is not None:
            self._http.close()
        if self._grpc is not None:
            self._grpc.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self.active.is_set():
                self._stop.wait(0.05)
                continue
            began = time.monotonic()
            ok, detail = self._rest() if self.protocol == "rest" else self._grpc_call()
            self.log.append(Request(self.model, self.protocol, began, time.monotonic(), ok, detail))
            if ok:
                self.answered.set()
            self._stop.wait(CLIENT_INTERVAL)

    def _rest(self) -> tuple[bool, str]:
        if self._http is None:
            self._http = http.client.HTTPConnection(self.address, 9000, timeout=DEADLINE)
        try:
            self._http.request(
                "POST",
                f"/v2/models/{self.model}/infer",
                BODY,
                {"Content-Type": "application/json"},
            )
            answer = self._http.getresponse()
            body = answer.read()
        except (OSError, http.client.HTTPException) as e:
            self._http.close()
            self._http = None
            return False, f"{type(e).__name__}: {e}"
        if answer.status == 200:
            return True, ""
        retry = answer.getheader("Retry-After")
        said = body[:200].decode(errors="replace")
        return False, f"{answer.status}{f' Retry-After {retry}' if retry else ''}: {said}"

    def _grpc_call(self) -> tuple[bool, str]:
        if self._grpc is None:
            self._grpc = grpcclient.InferenceServerClient(f"{self.address}:9001")
        tensor = grpcclient.InferInput("INPUT0", [1, 3], "FP32")
        tensor.set_data_from_numpy(np.array([[1.0, 2.0, 3.0]], dtype=np.float32))
        try:
            self._grpc.infer(self.model, [tensor], client_timeout=DEADLINE)
        except InferenceServerException as e:
            return False, f"{e.status()}: {str(e.message())[:200]}"
        return True, ""
