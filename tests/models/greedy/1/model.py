"""greedy: add_one that occupies more GPU memory than its pod asks for (sim/gpu/load.py reads
its config), for the demo of what tritonshare does about it."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out = pb_utils.Tensor("OUTPUT0", (data + 1).astype(data.dtype))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
