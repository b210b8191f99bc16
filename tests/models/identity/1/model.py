"""identity: each OUTPUT_<T> echoes INPUT_<T> (FP32, INT64 and BYTES), for tests and the demo."""

import triton_python_backend_utils as pb_utils

PAIRS = (
    ("INPUT_FP32", "OUTPUT_FP32"),
    ("INPUT_INT64", "OUTPUT_INT64"),
    ("INPUT_BYTES", "OUTPUT_BYTES"),
)


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            outputs = []
            for in_name, out_name in PAIRS:
                tensor = pb_utils.get_input_tensor_by_name(request, in_name)
                if tensor is not None:
                    outputs.append(pb_utils.Tensor(out_name, tensor.as_numpy()))
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
