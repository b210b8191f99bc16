"""Regenerate the agent API's Python code: `python -m protos.generate [OUTPUT_ROOT]`.

Runs grpc_tools.protoc (pinned in pyproject.toml) on protos/agent.proto. With OUTPUT_ROOT the code
is written under OUTPUT_ROOT/protos/ instead of in place, which the test uses to check that the
committed files are current.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO = "protos/agent.proto"


def generate(output_root: Path) -> None:
    """Write agent_pb2.py, agent_pb2.pyi and agent_pb2_grpc.py under output_root/protos/."""
    from grpc_tools import protoc  # test dependency: imported only when generating

    (output_root / "protos").mkdir(parents=True, exist_ok=True)
    args = [
        "protoc",
        f"-I{ROOT}",
        f"--python_out={output_root}",
        f"--pyi_out={output_root}",
        f"--grpc_python_out={output_root}",
        str(ROOT / PROTO),
    ]
    if protoc.main(args) != 0:
        raise SystemExit(f"protoc failed on {PROTO}")


def main() -> None:
    """Entry point: generate in place, or under the directory given as the first argument."""
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)


if __name__ == "__main__":
    main()
