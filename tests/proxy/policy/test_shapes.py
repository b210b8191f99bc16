"""The REST relay's check of an inference request's shapes against its body (`proxy.policy.shapes`):
keys read as a JSON parser reads them, strings and duplicates included, whole and in pieces."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.policy.refusals import BodyTooLargeError, MalformedRequestError
from proxy.policy.shapes import MAX_DIMENSION, MAX_JSON_BYTES, Shapes, check_json

BOMB = b'{"inputs":[{"name":"INPUT0","shape":[1,%d],"datatype":"FP32","data":[1]}]}' % 2**61
TOO_MANY = "more elements in their shapes than its JSON has bytes"


def check(body: bytes) -> None:
    check_json(body, len(body))


def test_the_91_byte_request_that_killed_triton_is_refused() -> None:
    with pytest.raises(MalformedRequestError, match=TOO_MANY):
        check(BOMB)
    check(b'{"inputs":[{"name":"INPUT0","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]}')


@pytest.mark.parametrize(
    "body",
    [
        BOMB.replace(b'"shape"', b'"sh\\u0061pe"'),  # the same key to any JSON parser
        BOMB.replace(b'"shape"', b'"\\u0073\\u0068ape"'),
        BOMB.replace(b'"datatype"', b'"shape":[1],"datatype"'),  # Python keeps the last
        BOMB.replace(b'"name"', b'"shape":[1],"name"'),  # Triton's parser keeps the first
        b'{"inputs":[{"shape":[1]}],"inputs":' + BOMB[10:],  # a duplicate of the list
        b'{"inputs":[{"shape":[40]},{"shape":[40]}]}',  # together more than the body
    ],
    ids=["escaped", "all-escaped", "first-of-two", "last-of-two", "second-list", "summed"],
)
def test_keys_are_read_as_a_json_parser_reads_them(body: bytes) -> None:
    with pytest.raises(MalformedRequestError, match=TOO_MANY):
        check(body)


def test_a_shape_inside_a_string_is_data() -> None:
    body = b'{"inputs":[{"name":"\\"shape\\":[1,99999]","shape":[1],"data":["shape"]}]}'
    check(body)


@pytest.mark.parametrize(
    ("dims", "shown"),
    [
        (b"[1,-1]", "-1"),
        (b"[1,2.0]", "a fraction or a boolean"),
        (b"[1e3]", "a fraction or a boolean"),
        (b"[true]", "a fraction or a boolean"),
        (b'["4"]', "4"),
        (b"[0,%d]" % (MAX_DIMENSION + 1), str(MAX_DIMENSION + 1)),
    ],
)
def test_a_dimension_that_is_not_an_int64_count_is_refused(dims: bytes, shown: str) -> None:
    with pytest.raises(MalformedRequestError, match=f"the dimension {shown},"):
        check(b'{"inputs":[{"name":"INPUT0","shape":%s,"data":[]}]}' % dims)


def test_zero_elements_pass_and_many_huge_dimensions_are_not_multiplied_whole() -> None:
    check(b'{"inputs":[{"shape":[0,%d,%d],"data":[]}]}' % (MAX_DIMENSION, MAX_DIMENSION))
    many = b",".join([b"%d" % MAX_DIMENSION] * 50_000)
    with pytest.raises(MalformedRequestError, match=TOO_MANY):
        check(b'{"inputs":[{"shape":[%s]}]}' % many)


@pytest.mark.parametrize(
    "body",
    [
        b'{"sh\\u0061pe":[1]',
        b'{"sh\\u0061pe":[1]} x',
        b'{"n\\u0061me":"\xff","shape":[1]}',
        b"[" * 5000 + b'"\\u0061"' + b"]" * 5000,
        b'{"shape":[1.0]}',
    ],
    ids=["cut", "trailing", "not-utf-8", "too-deep", "not-plain"],
)
def test_what_the_parser_cannot_read_is_refused_with_why(body: bytes) -> None:
    """Bodies the plain reading leaves to the parser (an escape, a dimension not plain digits)."""
    with pytest.raises(MalformedRequestError, match=r"the inference request|an input.s shape"):
        check(body)


def test_json_that_is_not_valid_and_plainly_within_goes_to_triton() -> None:
    """Triton refuses JSON that is not valid whole, before it reads a shape: without an escape,
    the plain reading of its shapes is all that matters."""
    for body in (b"", b'{"shape":[1]', b'{"inputs":[]} x', b'{"name":"\xff","shape":[1]}'):
        check(body)
    with pytest.raises(MalformedRequestError):  # not plainly within: to the parser
        check(b'{"shape":[1,%d]' % 2**61)


def test_a_json_part_over_the_bound_is_refused_whole_and_in_pieces() -> None:
    big = b'{"inputs":[{"shape":[1],"data":[1]}]}' + b" " * MAX_JSON_BYTES
    with pytest.raises(BodyTooLargeError, match="binary tensor extension"):
        check(big)
    shapes = Shapes()
    with pytest.raises(BodyTooLargeError, match="binary tensor extension"):
        for at in range(0, len(big), 65536):
            shapes.feed(big, at, min(at + 65536, len(big)))
    assert shapes.held <= MAX_JSON_BYTES + 65536
    later = Shapes(early=False)  # a compressed body: its inflation cap refuses first
    for at in range(0, len(big), 65536):
        later.feed(big, at, min(at + 65536, len(big)))
    assert later.held == 0
    with pytest.raises(BodyTooLargeError, match=f"over {MAX_JSON_BYTES} bytes \\({len(big)}\\)"):
        later.check(len(big))


def test_only_the_json_part_of_a_binary_body_is_kept() -> None:
    header = b'{"inputs":[{"shape":[1,6],"parameters":{"binary_data_size":24}}]}'
    body = header + b"\xff{[" * 8  # raw tensor bytes: neither UTF-8 nor JSON
    shapes = Shapes(len(header))
    for at in range(0, len(body), 5):
        shapes.feed(body, at, min(at + 5, len(body)))
    assert shapes.held == len(header)
    shapes.check(len(body))
    claims = header.replace(b"[1,6]", b"[1,1000]")  # 1,000 elements in 24 bytes
    shapes = Shapes(len(claims))
    shapes.feed(claims + b"\0" * 24)
    with pytest.raises(MalformedRequestError, match="more elements in its shape than its binary"):
        shapes.check(len(claims) + 24)


def test_json_data_is_bounded_by_the_json_and_binary_data_by_its_part() -> None:
    """A body padded with binary bytes does not let an input with JSON data declare more."""
    padded = b'{"inputs":[{"shape":[1,1000],"data":[1]}]}'
    with pytest.raises(MalformedRequestError, match=TOO_MANY):
        check_json(padded, len(padded) + 2000)
    two = b'{"inputs":[{"shape":[4],"parameters":{"binary_data_size":16}},'
    two += b'{"shape":[4],"parameters":{"binary_data_size":16}}]}'
    check_json(two, len(two) + 32)
    with pytest.raises(MalformedRequestError, match="add up to more than the 31 bytes"):
        check_json(two, len(two) + 31)
    # Sizes that disagree (Triton reads the first, Python the last) count as JSON data.
    unsure = b'{"inputs":[{"shape":[1000],"parameters":{"binary_data_size":4000},'
    unsure += b'"parameters":{"binary_data_size":4}}]}'
    with pytest.raises(MalformedRequestError, match=TOO_MANY):
        check_json(unsure, len(unsure) + 4000)


# -- against a reference: every `shape` of every object, read by json.loads on the whole body --


def reference(body: bytes) -> bool:
    """Whether a body passes, as json.loads reads it: all pairs kept, then walked."""
    shapes: list[Any] = []

    def walk(value: Any) -> None:
        if isinstance(value, list):
            for item in value:
                walk(item)
        elif isinstance(value, tuple):  # an object, as its pairs
            for key, item in value:
                if key == "shape":
                    shapes.append(item)
                walk(item)

    walk(json.loads(body, object_pairs_hook=tuple))
    total = 0
    for shape in shapes:
        if isinstance(shape, list):
            if any(type(d) is not int or not 0 <= d <= MAX_DIMENSION for d in shape):
                return False
            elements = 1
            for d in shape:
                elements *= d
            total += elements
    return total <= len(body)


KEY = st.sampled_from(["shape", "sh\\u0061pe", "\\u0073hape", "name", "data", "shap", "shape "])
DIM = st.one_of(
    st.integers(min_value=0, max_value=40),
    st.integers(min_value=-2, max_value=2**64),
    st.sampled_from(["1.0", "true", '"2"']),
)


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    def member() -> str:
        key = draw(KEY)
        if draw(st.booleans()):
            value = "[" + ",".join(str(d) for d in draw(st.lists(DIM, max_size=4))) + "]"
        else:
            value = json.dumps(draw(st.text(alphabet='shape"\\[]{}:,', max_size=10)))
        return f'"{key}":{value}'

    inputs = [
        "{" + ",".join(member() for _ in range(draw(st.integers(0, 4)))) + "}"
        for _ in range(draw(st.integers(0, 3)))
    ]
    return ('{"inputs":[' + ",".join(inputs) + "]}").encode()


@given(requests(), st.lists(st.integers(min_value=0), max_size=6))
@settings(max_examples=300, deadline=None)
def test_the_check_answers_as_json_loads_on_the_whole_body(body: bytes, cuts: list[int]) -> None:
    expected = reference(body)
    try:
        check(body)
        passed = True
    except MalformedRequestError:
        passed = False
    assert passed == expected, body
    shapes = Shapes()
    last = 0
    for cut in [*sorted(c % (len(body) + 1) for c in cuts), len(body)]:
        shapes.feed(body, last, cut)
        last = cut
    try:
        shapes.check(len(body))
        pieces_passed = True
    except MalformedRequestError:
        pieces_passed = False
    assert pieces_passed == expected, body
