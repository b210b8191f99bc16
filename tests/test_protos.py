"""The committed generated code is what `make proto` produces from protos/agent.proto today."""

from __future__ import annotations

from pathlib import Path

import pytest

from protos import generate

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", ["agent_pb2.py", "agent_pb2.pyi", "agent_pb2_grpc.py"])
def test_generated_code_is_current(tmp_path: Path, name: str) -> None:
    generate.generate(tmp_path)
    fresh = (tmp_path / "protos" / name).read_text()
    committed = (ROOT / "protos" / name).read_text()
    assert committed == fresh, f"protos/{name} is stale: run `make proto` and commit the result"
