"""sleepy: waits DELAY_MS milliseconds, then echoes it; holds requests in flight for tests."""

import time
from typing import Any

import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found]


class TritonPythonModel:
    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            delay = pb_utils.get_input_tensor_by_name(request, "DELAY_MS").as_numpy()
            time.sleep(int(delay.reshape(-1)[0]) / 1000)
            out = pb_utils.Tensor("OUTPUT0", delay)
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
