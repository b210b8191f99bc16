"""The Common Expression Language of admission policies, on cel-python: the only module that
imports `celpy`.

`CelEnvironment.compile` parses an expression once (programs are cached by their text) and
`Program.evaluate` runs it over values made by `to_cel` from JSON. Errors are `CelError`, with the
message cut to what a policy author needs. CEL's own errors are values: `Program.value_or_error`
keeps one as the value of a policy variable, so it fails only the expressions that use it, as in
Kubernetes' lazily evaluated `variables`.

What Kubernetes' CEL has and cel-python does not: the standard macros and functions (`has`, `all`,
`exists`, `map`, `filter`, `size`, `in`, `startsWith`, `endsWith`, `contains`, `matches`) are there;
of Kubernetes' extension libraries only `lowerAscii`, `upperAscii`, `trim`, `split`, `join` and the
quantity library (`quantity`, `isQuantity`, `compareTo`, `isGreaterThan`, `isLessThan`, `asInteger`,
`asApproximateFloat`, `add`, `sub`, `sign`) are added here; optional types (`?.`, `[?]`,
`optional.of`) do not parse; the `authorizer` variable is not bound. Each of these fails with a
CelError that says so, and the policy's failurePolicy decides. No type checking happens before
evaluation (Kubernetes refuses ill-typed expressions when a policy is written; here they fail when
they run).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

import celpy
from celpy import celparser, celtypes
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError

from common.quantity import quantity_decimal

_UNDECLARED = re.compile(r"undeclared reference to '([^']+)'")
_AUTHORIZER = re.compile(r"\bauthorizer\b")


class CelError(Exception):
    """An expression that does not compile, or whose evaluation fails."""


def to_cel(value: Any) -> Any:
    """A JSON value (dicts, lists, strings, numbers, booleans, None) as a CEL value."""
    return json_to_cel(value)


def variables_map(values: Mapping[str, Any]) -> Any:
    """The CEL map `variables`: names to values (or to the errors `value_or_error` kept)."""
    return celtypes.MapType({celtypes.StringType(k): v for k, v in values.items()})


def as_bool(value: Any) -> bool | None:
    """A CEL bool as a Python bool; None for any other type."""
    # Some of cel-python's functions answer with Python's own bool and str.
    return bool(value) if isinstance(value, celtypes.BoolType | bool) else None


def as_str(value: Any) -> str | None:
    """A CEL string as a Python str; None for any other type."""
    return str(value) if isinstance(value, str) else None


def _explain(error: Exception) -> str:
    """celpy's message without its dump of the whole activation."""
    text = str(error.args[0]) if error.args else str(error)
    missing = _UNDECLARED.search(text)
    if missing:
        return (
            f"undeclared reference to '{missing.group(1)}' (the simulated API server's CEL,"
            " cel-python, has no such variable or function; see docs/sim.md)"
        )
    return text.split(" (in activation")[0]


def _split(text: celtypes.StringType, separator: celtypes.StringType) -> celtypes.ListType:
    return celtypes.ListType([celtypes.StringType(p) for p in str(text).split(str(separator))])


def _join(items: celtypes.ListType, separator: celtypes.StringType | None = None) -> Any:
    return celtypes.StringType(str(separator or "").join(str(i) for i in items))


class Quantity:
    """A value of Kubernetes' CEL quantity library: an exact decimal, compared by value."""

    def __init__(self, value: Decimal) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"quantity({self.value})"


def _quantity(text: Any) -> Quantity:
    value = quantity_decimal(str(text))
    if value is None:
        raise ValueError(f"{str(text)!r} is not a quantity")
    return Quantity(value)


def _is_quantity(text: Any) -> celtypes.BoolType:
    return celtypes.BoolType(quantity_decimal(str(text)) is not None)


def _other(value: Any) -> Decimal:
    return value.value if isinstance(value, Quantity) else Decimal(int(value))


def _compare(left: Quantity, right: Any) -> celtypes.IntType:
    a, b = left.value, _other(right)
    return celtypes.IntType((a > b) - (a < b))


def _as_integer(q: Quantity) -> celtypes.IntType:
    if q.value != q.value.to_integral_value():
        raise ValueError(f"{q.value} is not an integer")
    return celtypes.IntType(int(q.value))


# Kubernetes' extension functions that cel-python lacks, as receiver-style calls.
_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "quantity": _quantity,
    "isQuantity": _is_quantity,
    "compareTo": _compare,
    "isGreaterThan": lambda a, b: celtypes.BoolType(a.value > _other(b)),
    "isLessThan": lambda a, b: celtypes.BoolType(a.value < _other(b)),
    "asInteger": _as_integer,
    "isInteger": lambda q: celtypes.BoolType(q.value == q.value.to_integral_value()),
    "asApproximateFloat": lambda q: celtypes.DoubleType(float(q.value)),
    "add": lambda a, b: Quantity(a.value + _other(b)),
    "sub": lambda a, b: Quantity(a.value - _other(b)),
    "sign": lambda q: celtypes.IntType((q.value > 0) - (q.value < 0)),
    "lowerAscii": lambda s: celtypes.StringType(str(s).lower()),
    "upperAscii": lambda s: celtypes.StringType(str(s).upper()),
    "trim": lambda s: celtypes.StringType(str(s).strip()),
    "split": _split,
    "join": _join,
}


class Program:
    """One compiled expression."""

    def __init__(self, expression: str, runner: Any, problem: str = "") -> None:
        self.expression = expression
        self._runner = runner
        self._problem = problem

    def evaluate(self, activation: Mapping[str, Any]) -> Any:
        """The expression's CEL value over `activation` (names to `to_cel` values)."""
        if self._problem:
            raise CelError(self._problem)
        try:
            return self._runner.evaluate(dict(activation))
        except CELEvalError as e:
            raise CelError(_explain(e)) from e
        except (TypeError, ValueError, KeyError, AttributeError, RecursionError) as e:
            # cel-python lets some type mismatches escape as Python errors; they are CEL errors.
            raise CelError(f"{type(e).__name__}: {e}") from e

    def value_or_error(self, activation: Mapping[str, Any]) -> Any:
        """The value, or the error as a CEL error value (which fails what uses it)."""
        try:
            return self.evaluate(activation)
        except CelError as e:
            return CELEvalError(str(e))


class CelEnvironment:
    """Compiles expressions for admission policies; caches each text's program."""

    def __init__(self) -> None:
        self._environment = celpy.Environment()
        self._programs: dict[str, Program] = {}

    def compile(self, expression: str) -> Program:
        """The program for `expression`. One that cannot compile still gives a Program, whose
        evaluation raises the compile error: as upstream, a policy's failurePolicy decides."""
        program = self._programs.get(expression)
        if program is not None:
            return program
        if _AUTHORIZER.search(expression):
            program = Program(
                expression,
                None,
                "the CEL variable 'authorizer' is not implemented by the simulated API server",
            )
        else:
            try:
                tree = self._environment.compile(expression)
                program = Program(expression, self._environment.program(tree, _FUNCTIONS))
            except celparser.CELParseError as e:
                where = " ".join(_explain(e).split())
                program = Program(
                    expression,
                    None,
                    f"compilation failed: {where} (cel-python cannot parse this; Kubernetes'"
                    " optional types are not supported by the simulated API server)",
                )
        self._programs[expression] = program
        return program
