"""The one refusal table (`proxy.policy.refusals`): every refusal type has its row, and is used.

Once, five of the seven refusal types were never raised while the relays picked their
own statuses and codes by hand; now each relay raises or hands on a type and asks the table.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import grpc
import pytest

from proxy.policy import refusals

PROXY = Path(refusals.__file__).resolve().parent.parent
TYPES = [
    cls
    for _, cls in inspect.getmembers(refusals, inspect.isclass)
    if issubclass(cls, refusals.ProxyError) and cls is not refusals.ProxyError
]


def _constructed() -> set[str]:
    """Names of the refusal types some product module outside the table constructs."""
    names: set[str] = set()
    for path in PROXY.rglob("*.py"):
        if path.name == "refusals.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                names.add(name)
    return names


@pytest.mark.parametrize("kind", TYPES, ids=lambda cls: cls.__name__)
def test_each_refusal_has_its_row_and_is_raised_somewhere(kind: type[refusals.ProxyError]) -> None:
    assert kind in refusals.STATUS, f"{kind.__name__} has no row in the table"
    assert kind.__name__ in _constructed(), f"{kind.__name__} is never raised: remove it"


def test_the_table_answers_each_protocol() -> None:
    error = refusals.BodyTooLargeError("too large")
    assert refusals.http_status(error) == 413
    assert refusals.grpc_code(error) is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert refusals.http_status(refusals.UpstreamError("gone")) == 502
    assert refusals.grpc_code(refusals.UpstreamError("gone")) is grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize(
    ("message", "lacks"),
    [
        (b"Request for unknown model: 'team-h.a.0a0a0a0a' is not found", True),
        (b'{"error":"Request for unknown model: \'a\' has no available versions"}', True),
        (b"Request for unknown model: 'a' version 9 is not found", False),
        (b"Model version not ready", False),
        (b"unexpected inference input 'x' for model 'a'", False),
    ],
)
def test_tritons_word_that_it_has_no_model_is_told_from_a_missing_version(
    message: bytes, lacks: bool
) -> None:
    """Triton's own texts (2.51), REST's body and gRPC's grpc-message alike."""
    assert refusals.lacks_model(message) is lacks
