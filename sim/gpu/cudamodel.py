"""A Python-backend model that holds a known amount of GPU memory: what the GPU checks load.

On a GPU instance its `model.py` creates a CUDA context through the driver library
(`libcuda.so.1`, no torch) and allocates `allocate` bytes in it until it is unloaded, so its
measured figure shows what a stub process costs beyond what it allocates (the per-process
allowance). It adds one to INPUT0 (FP32): a wrong answer shows a broken stub environment (numpy 2
makes every answer fail). Its config also declares `sim_gpu_memory` (`sim.gpu.load`), so on the
mock GPUs it occupies the same bytes. Used by `tests/gpu/loadcheck.py` and `sim.demo.gpucheck`.
"""

from __future__ import annotations

from pathlib import Path

MODEL_PY = r'''
import ctypes
import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Adds one; on a GPU instance it first creates a CUDA context and allocates the bytes its
    config's `allocate_bytes` parameter names, held until it is unloaded."""

    def initialize(self, args):
        config = json.loads(args["model_config"])
        size = int(config["parameters"]["allocate_bytes"]["string_value"])
        self.cuda = self.pointer = None
        if args["model_instance_kind"] != "GPU" or not size:
            return
        cuda = ctypes.CDLL("libcuda.so.1")

        def check(result, what):
            if result != 0:
                raise pb_utils.TritonModelException(f"{what} failed: CUDA error {result}")

        device, context = ctypes.c_int(), ctypes.c_void_p()
        check(cuda.cuInit(0), "cuInit")
        check(cuda.cuDeviceGet(ctypes.byref(device), int(args["model_instance_device_id"])),
              "cuDeviceGet")
        check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), "cuCtxRetain")
        check(cuda.cuCtxSetCurrent(context), "cuCtxSetCurrent")
        pointer = ctypes.c_uint64()
        check(cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(size)), "cuMemAlloc")
        check(cuda.cuMemsetD8_v2(pointer, ctypes.c_ubyte(1), ctypes.c_size_t(size)), "cuMemset")
        check(cuda.cuCtxSynchronize(), "cuCtxSynchronize")
        self.cuda, self.pointer = cuda, pointer

    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", data + 1)]))
        return responses

    def finalize(self):
        if self.pointer is not None:
            self.cuda.cuMemFree_v2(self.pointer)
'''

CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
parameters {{ key: "allocate_bytes" value: {{ string_value: "{size}" }} }}
parameters {{ key: "sim_gpu_memory" value: {{ string_value: "{size}" }} }}
"""

REQUEST = {"inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
ANSWER = [2.0, 3.0, 4.0, 5.0]
"""What a working model answers to REQUEST (OUTPUT0's data)."""


def model_files(name: str, allocate: int) -> dict[str, bytes]:
    """The model's files, path -> bytes, named `name` in its config."""
    return {
        "config.pbtxt": CONFIG.format(name=name, size=allocate).encode(),
        "1/model.py": MODEL_PY.encode(),
    }


def write_model(directory: Path, allocate: int) -> dict[str, bytes]:
    """Write the model into `directory` (named after it); returns its files."""
    files = model_files(directory.name, allocate)
    for path, data in files.items():
        (directory / path).parent.mkdir(parents=True, exist_ok=True)
        (directory / path).write_bytes(data)
    return files
