"""Which Triton backends run a model in a process of its own, and the backend a pod declares.

Triton's Python backend (and every backend built on it: a `runtime` that is a `.py` file, vLLM)
starts one stub process per model instance, with a CUDA context of its own: on a GPU it takes
524 MiB (the CUDA runtime alone) to 616 MiB (torch) beyond what the model allocates, which the
request a user writes does not include (docs/results.md). ONNX Runtime, TensorRT, PyTorch
(libtorch), TensorFlow and OpenVINO run inside Triton's process and use Triton's context.

The binder books the per-process allowance (`--gpu-mem-process-allowance`) on top of the request
of every model that may run in its own process: all but those whose pod (or TritonModel) declares
an in-process backend in the `<prefix>backend` annotation. The declaration only ever lowers what
is booked; the agent, which reads the model's config.pbtxt, refuses a load whose backend runs in
its own process while its pod declared one that does not, so a wrong declaration costs no other
model memory.

Pure: names in, answers out.
"""

from __future__ import annotations

import re

MIB = 1024**2
PROCESS_ALLOWANCE = 640 * MIB
"""The default allowance: the largest context measured (616 MiB, torch), rounded up to 64 MiB."""
IN_PROCESS_BACKENDS = frozenset({"onnxruntime", "tensorrt", "pytorch", "tensorflow", "openvino"})
"""Backends whose models run in Triton's own process (unless a `runtime` replaces them)."""
_BACKEND_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")


class BackendError(ValueError):
    """A declared backend that is not a backend's name; the message says what to write."""


def runs_in_own_process(backend: str, runtime: str = "") -> bool:
    """Whether a model of `backend` (a config's `backend`, or a platform's backend) with
    `runtime` runs in a process of its own; an unknown or undeclared ("") backend may."""
    return backend not in IN_PROCESS_BACKENDS or runtime.endswith(".py")


def declared_backend(value: str | None, key: str) -> str:
    """The backend a `key` annotation declares ("" when absent), or BackendError."""
    if value is None or value == "":
        return ""
    if not _BACKEND_RE.fullmatch(value):
        raise BackendError(
            f"annotation {key}={value[:64]!r} is not a Triton backend's name; write the "
            f"config.pbtxt's backend, such as {key}: onnxruntime, or leave it out"
        )
    return value


def process_allowance(declared: str, allowance: int) -> int:
    """What the binder books beyond a model's request for its own process: `allowance`, or 0
    when the declared backend runs in Triton's process."""
    return allowance if runs_in_own_process(declared) else 0
