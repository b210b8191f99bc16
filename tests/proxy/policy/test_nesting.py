"""The bound on a REST body's JSON nesting (`proxy.policy.nesting`), fed whole and in pieces cut
anywhere: the depth it follows is the JSON's, strings and escapes included."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.policy.nesting import MAX_NESTING, Nesting, check_whole
from proxy.policy.refusals import MalformedRequestError


def nested(depth: int) -> bytes:
    return b'{"inputs":' + b'{"a":' * depth + b"1" + b"}" * depth + b"}"


def feed_in_pieces(body: bytes, cuts: list[int], json_bytes: int = -1) -> None:
    nesting = Nesting(json_bytes)
    last = 0
    for cut in [*sorted(c % (len(body) + 1) for c in cuts), len(body)]:
        nesting.feed(body, last, cut)
        last = cut


@given(st.lists(st.integers(min_value=0), max_size=20))
@settings(max_examples=60, deadline=None)
def test_a_body_past_the_bound_is_refused_wherever_it_is_cut(cuts: list[int]) -> None:
    with pytest.raises(MalformedRequestError, match=f"deeper than {MAX_NESTING}"):
        feed_in_pieces(nested(MAX_NESTING), cuts)  # inputs + MAX_NESTING levels
    feed_in_pieces(nested(MAX_NESTING - 1), cuts)


@given(
    st.lists(st.text(alphabet='[]{}"\\ab', max_size=12), max_size=30),
    st.lists(st.integers(min_value=0), max_size=20),
)
@settings(max_examples=80, deadline=None)
def test_brackets_and_escapes_inside_strings_are_data(strings: list[str], cuts: list[int]) -> None:
    """Closing brackets in strings cannot hide real depth, nor opening ones add to it."""
    shallow = json.dumps({"inputs": [{"name": s, "data": [[1], [2]]} for s in strings]}).encode()
    feed_in_pieces(shallow, cuts)
    hiding = json.dumps({"x": "]" * 20_000 + "}" * 20_000}).encode()[:-1] + b","
    deep = hiding + b'"y":' + b"[" * MAX_NESTING + b"]" * MAX_NESTING + b"}"
    # Valid JSON (too deep for Python's own parser to check): the string's closings are data.
    with pytest.raises(MalformedRequestError):
        feed_in_pieces(deep, cuts)


def test_a_large_shallow_tensor_passes_and_binary_data_is_not_json() -> None:
    rows = b"[" + b",".join(b"[1.5,2.5]" for _ in range(3 * MAX_NESTING)) + b"]"
    whole = b'{"inputs":[{"data":' + rows + b"}]}"
    check_whole(whole, 0, len(whole))
    header = b'{"inputs":[{"name":"x","parameters":{"binary_data_size":400000}}]}'
    binary = b"[" * 400_000  # raw tensor bytes that happen to be brackets
    body = header + binary
    feed_in_pieces(body, [7, 100, 5000], json_bytes=len(header))
    with pytest.raises(MalformedRequestError):
        feed_in_pieces(body, [7, 100, 5000])


def test_chunk_framing_is_bounded_by_its_openings() -> None:
    nesting = Nesting()
    nesting.count(b"{" * MAX_NESTING, 0, MAX_NESTING)
    with pytest.raises(MalformedRequestError):
        nesting.count(b';ext="{', 0, 7)
