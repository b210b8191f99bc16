"""The simulated node's stand-in for Triton's ONNX Runtime backend reads deploy/example's model
(one Add of an FP32 initializer) and refuses, naming it, an operator it does not run: it never
pretends to serve a model it cannot compute."""

from __future__ import annotations

import importlib.util
import sys
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from sim.triton import STANDIN_BACKENDS
from tests.deploy.example_model import MODEL_FILE, build


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", types.ModuleType("pb"))
    spec = importlib.util.spec_from_file_location(
        "onnx_standin", STANDIN_BACKENDS / "onnxruntime" / "model.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module


def test_the_example_model_is_one_add_of_a_constant(standin: Any) -> None:
    nodes, constants = standin.parse(MODEL_FILE.read_bytes())
    assert nodes == [("Add", ["INPUT0", "one"], ["OUTPUT0"])]
    assert constants["one"].dtype == np.float32 and constants["one"].tolist() == [1.0]


def test_an_operator_it_does_not_run_is_refused_by_name(standin: Any) -> None:
    model = build().replace(b"Add", b"Erf")  # same length: a graph of one Erf
    with pytest.raises(ValueError, match="operator 'Erf' is not one"):
        standin.parse(model)
