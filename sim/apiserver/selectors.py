"""Label and field selectors: parsing, with upstream's grammar and errors, and matching.

Label selectors take equality (`=`, `==`, `!=`), set-based (`in`, `notin`, `key`, `!key`) and
numeric (`>`, `<`) requirements, comma-ANDed, with keys and values validated as label keys and
values are. Field selectors take `=`, `==`, `!=` on the fields a resource declares, with `\\`
escapes, and reject any other field with upstream's "field label not supported" message. A parse
failure raises `ApiError` 400 BadRequest. Pure functions over JSON-ready dicts; no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sim.apiserver.errors import ApiError, bad_request

JsonObject = dict[str, Any]

_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_NAME_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_OPERATOR_CHARS = "=!<>(),"


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: str  # "=", "!=", "in", "notin", "exists", "!", "gt", "lt"
    values: tuple[str, ...]

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        op = self.operator
        if op in ("=", "in"):
            return present and value in self.values
        if op in ("!=", "notin"):
            return not present or value not in self.values
        if op == "exists":
            return present
        if op == "!":
            return not present
        if not present or value is None:
            return False
        try:
            number = int(value)
        except ValueError:
            return False
        bound = int(self.values[0])
        return number > bound if op == "gt" else number < bound


@dataclass(frozen=True)
class LabelSelector:
    requirements: tuple[Requirement, ...]

    def matches(self, obj: JsonObject) -> bool:
        if not self.requirements:
            return True
        labels = obj.get("metadata", {}).get("labels") or {}
        return all(r.matches(labels) for r in self.requirements)


EVERYTHING = LabelSelector(())


def _tokens(text: str) -> list[str]:
    tokens: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch.isspace():
            i += 1
        elif text.startswith(("==", "!="), i):
            tokens.append(text[i : i + 2])
            i += 2
        elif ch in _OPERATOR_CHARS:
            tokens.append(ch)
            i += 1
        else:
            start = i
            while i < len(text) and not text[i].isspace() and text[i] not in _OPERATOR_CHARS:
                i += 1
            tokens.append(text[start:i])
    return tokens


def _is_identifier(tok: str | None) -> bool:
    return tok is not None and tok not in ("==", "!=") and tok not in _OPERATOR_CHARS


def _check_key(key: str) -> None:
    prefix, slash, name = key.rpartition("/")
    problems = []
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        problems.append("prefix part must be a lowercase RFC 1123 subdomain")
    if not name or len(name) > 63 or not _NAME_PART.match(name):
        problems.append(
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start"
            " and end with an alphanumeric character (e.g. 'MyName', or 'my.name', or '123-abc')"
            " and be at most 63 characters"
        )
    if problems:
        raise bad_request(
            f'unable to parse requirement: key: Invalid value: "{key}": {"; ".join(problems)}'
        )


def _check_value(value: str) -> None:
    if len(value) > 63 or not _LABEL_VALUE.match(value):
        raise bad_request(
            f'unable to parse requirement: values[0]: Invalid value: "{value}": a valid label'
            " must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and"
            " must start and end with an alphanumeric character (e.g. 'MyValue', or 'my_value',"
            " or '12345'), at most 63 characters"
        )


def parse_label_selector(text: str) -> LabelSelector:
    """Parse `text` as `labels.Parse` does; an empty selector matches everything."""
    tokens = _tokens(text)
    if not tokens:
        return EVERYTHING
    requirements: list[Requirement] = []
    pos = 0

    def peek() -> str | None:
        return tokens[pos] if pos < len(tokens) else None

    def fail(found: str | None, expected: str) -> ApiError:
        return bad_request(
            f"unable to parse label selector {text!r}: found '{found or 'EOS'}', expected: "
            f"{expected}"
        )

    while True:
        negated = False
        if peek() == "!":
            negated = True
            pos += 1
        key = peek()
        if not _is_identifier(key):
            raise fail(key, "identifier")
        assert key is not None
        _check_key(key)
        pos += 1
        op = peek()
        if negated:
            requirements.append(Requirement(key, "!", ()))
        elif op is None or op == ",":
            requirements.append(Requirement(key, "exists", ()))
        elif op in ("=", "==", "!=", ">", "<"):
            pos += 1
            value = peek()
            if _is_identifier(value):
                assert value is not None
                pos += 1
            else:
                value = ""
            if op in (">", "<"):
                if not re.fullmatch(r"-?\d+", value):
                    raise bad_request(
                        f"unable to parse requirement: for 'Gt', 'Lt' operators, the value must"
                        f" be an integer (found {value!r})"
                    )
            else:
                _check_value(value)
            kind = {"==": "=", ">": "gt", "<": "lt"}.get(op, op)
            requirements.append(Requirement(key, kind, (value,)))
        elif op in ("in", "notin"):
            pos += 1
            if peek() != "(":
                raise fail(peek(), "'('")
            pos += 1
            values: list[str] = []
            while True:
                tok = peek()
                if _is_identifier(tok):
                    assert tok is not None
                    _check_value(tok)
                    values.append(tok)
                    pos += 1
                    tok = peek()
                elif tok in (",", ")"):
                    values.append("")
                else:
                    raise fail(tok, "',', ')' or identifier")
                if tok == ")":
                    pos += 1
                    break
                if tok != ",":
                    raise fail(tok, "',' or ')'")
                pos += 1
            if values == [""]:
                raise bad_request(
                    "unable to parse requirement: values: Invalid value: []: for 'in', 'notin'"
                    " operators, values set can't be empty"
                )
            requirements.append(Requirement(key, op, tuple(values)))
        else:
            raise fail(op, "'=', '!=', '==', 'in', 'notin', '>', '<' or ','")
        tok = peek()
        if tok is None:
            break
        if tok != ",":
            raise fail(tok, "','")
        pos += 1
    return LabelSelector(tuple(requirements))


@dataclass(frozen=True)
class FieldTerm:
    field: str
    equal: bool
    value: str
    getter: Callable[[JsonObject], str]

    def matches(self, obj: JsonObject) -> bool:
        return (self.getter(obj) == self.value) == self.equal


@dataclass(frozen=True)
class FieldSelector:
    terms: tuple[FieldTerm, ...]

    def matches(self, obj: JsonObject) -> bool:
        return all(term.matches(obj) for term in self.terms)

    def equality(self, field: str) -> str | None:
        """The value `field` must equal, if one term pins it (for index lookups)."""
        for term in self.terms:
            if term.field == field and term.equal:
                return term.value
        return None


NO_FIELDS = FieldSelector(())


def _split_unescaped(text: str, sep: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    escaped = False
    for ch in text:
        if escaped:
            current.append("\\" + ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == sep:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    if escaped:
        current.append("\\")
    parts.append("".join(current))
    return parts


def _unescape(value: str, whole: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(value):
        ch = value[i]
        if ch == "\\":
            if i + 1 >= len(value) or value[i + 1] not in "\\,=":
                raise bad_request(f"invalid field selector: {whole!r}: invalid escape sequence")
            out.append(value[i + 1])
            i += 2
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _find_operator(term: str) -> tuple[int, str] | None:
    i = 0
    while i < len(term):
        if term[i] == "\\":
            i += 2
            continue
        for op in ("!=", "==", "="):
            if term.startswith(op, i):
                return i, op
        i += 1
    return None


def parse_field_selector(
    text: str, labels: Mapping[str, Callable[[JsonObject], str]]
) -> FieldSelector:
    """Parse `text` as `fields.ParseSelector` does, allowing only the resource's field labels."""
    if not text.strip():
        return NO_FIELDS
    terms: list[FieldTerm] = []
    for raw in _split_unescaped(text, ","):
        found = _find_operator(raw)
        if found is None:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{raw}'")
        index, op = found
        name = raw[:index].strip()
        value = _unescape(raw[index + len(op) :], text)
        getter = labels.get(name)
        if getter is None:
            raise bad_request(f"field label not supported: {name}")
        terms.append(FieldTerm(name, op != "!=", value, getter))
    return FieldSelector(tuple(terms))
