"""The Triton release a node runs, and the versions of what it carries: the one place these live.

The node pod's image pins one NGC Triton release (`deploy/base/node`, the chart's
`triton.image.tag`); each backend in it reads only what its own version reads. ONNX Runtime
refuses a model whose IR version or `ai.onnx` opset is newer than the ONNX release it was built
with; TensorRT deserializes only plans built by its own version; the Python backend's stub runs
the container's Python. The agent checks a model against these before Triton loads it
(`agent.installs.runtimefit`), the simulated node's backends refuse what they refuse, and
docs/support.md lists them. A pool may run another release (the chart's `node.pools[].tritonImage`):
each agent publishes its node's (`agent.status.tritonversion`, by `release_of_server`), and the
binder places a model that needs a release only there (`binder.framework.tritonversion`).

Data only: no I/O, no import of any part.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TritonRelease:
    """One NGC Triton release and the versions of the backends it ships."""

    release: str
    """The NGC container's tag without `-py3` (`24.10`)."""
    server: str
    """Triton's own version, as its server metadata reports it (`2.51.0`)."""
    onnxruntime: str
    """The ONNX Runtime of the `onnxruntime` backend."""
    onnx_max_ir: int
    """The newest ONNX IR version that ONNX Runtime reads (ModelProto's `ir_version`)."""
    onnx_max_opset: int
    """The newest opset of the default domain (`""`, `ai.onnx`) that ONNX Runtime loads."""
    onnx_max_ml_opset: int
    """The newest opset of the `ai.onnx.ml` domain (classical ML operators) it loads."""
    tensorrt: str
    """The TensorRT of the `tensorrt` backend: a plan must be built by this version."""
    python: str
    """The Python of the Python backend's stub (and of an `EXECUTION_ENV_PATH` environment)."""

    @property
    def image(self) -> str:
        return f"nvcr.io/nvidia/tritonserver:{self.release}-py3"


RELEASES = {
    "24.10": TritonRelease(
        release="24.10",
        server="2.51.0",
        onnxruntime="1.19.2",
        onnx_max_ir=10,
        onnx_max_opset=21,
        onnx_max_ml_opset=5,
        tensorrt="10.5.0",
        python="3.10",
    ),
}
"""Triton releases by NGC tag. ONNX Runtime 1.19.2 was seen to load IR 10, opset 21 and `ai.onnx.ml`
opset 5, and to refuse IR 11, opset 22 and `ai.onnx.ml` opset 6."""

PINNED = RELEASES["24.10"]
"""The release the node pod's image pins, and the one the simulated cluster follows."""

DEFAULT_ONNX_DOMAINS = frozenset({"", "ai.onnx"})
"""The names of ONNX's default operator domain in a model's `opset_import`."""
ML_ONNX_DOMAIN = "ai.onnx.ml"

_MONTHLY_SINCE = (2, 30, 2023, 1)
"""Triton 2.30.0 is NGC 23.01; since then each monthly release has raised the minor version by one
(2.45.0 is 24.04, 2.51.0 is 24.10)."""


def release_of_server(server: str) -> str | None:
    """The NGC release (`24.10`) of a Triton whose server metadata reports `server` (`2.51.0`):
    a known release's, else the one the monthly numbering gives; None for a version outside it."""
    for known in RELEASES.values():
        if known.server == server:
            return known.release
    parts = server.split(".")
    if len(parts) < 2 or not all(p.isdigit() for p in parts[:2]):
        return None
    major, minor = int(parts[0]), int(parts[1])
    first_major, first_minor, year, month = _MONTHLY_SINCE
    if major != first_major or minor < first_minor:
        return None
    months = year * 12 + month - 1 + minor - first_minor
    return f"{months // 12 % 100:02d}.{months % 12 + 1:02d}"
