"""text_stream: a decoupled model answering one request with `repeat` responses.

Each response's text_output is "<text_input> <i>"; `delay_ms` waits before each response, so
tests can see chunks arrive one by one and can cancel a stream midway. Serves generate,
generate_stream and gRPC ModelStreamInfer in the proxy's tests.
"""

import threading
import time
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found]


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        self._threads: list[threading.Thread] = []

    def execute(self, requests: list[Any]) -> None:
        # Decoupled: answer from threads, so one long stream does not hold up the others.
        for request in requests:
            thread = threading.Thread(target=self._answer, args=(request,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _answer(self, request: Any) -> None:
        sender = request.get_response_sender()
        text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0]
        if isinstance(text, bytes):
            text = text.decode()
        repeat = pb_utils.get_input_tensor_by_name(request, "repeat")
        count = int(repeat.as_numpy().reshape(-1)[0]) if repeat is not None else 1
        delay = pb_utils.get_input_tensor_by_name(request, "delay_ms")
        delay_s = (int(delay.as_numpy().reshape(-1)[0]) if delay is not None else 0) / 1000
        for i in range(count):
            if delay_s:
                time.sleep(delay_s)
            if request.is_cancelled():
                break
            out = pb_utils.Tensor("text_output", np.array([f"{text} {i}".encode()], dtype=object))
            sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self) -> None:
        for thread in self._threads:
            thread.join(timeout=5)
