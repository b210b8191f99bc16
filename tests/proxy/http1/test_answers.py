"""Triton's answers to health and readiness calls given the Open Inference Protocol's JSON body,
their status and connection kept (`answers.with_health_body`)."""

from __future__ import annotations

import pytest

from proxy.http1.answers import with_health_body

READY = b'{"ready":true}'
NOT_READY = b'{"ready":false}'


def test_a_success_without_a_body_gets_the_protocols_body() -> None:
    triton = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nContent-Type: text/plain\r\n\r\n"
    assert with_health_body(triton, READY, NOT_READY) == (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 14\r\n\r\n" + READY
    )


def test_a_success_with_a_body_gets_the_protocols_body_in_its_place() -> None:
    # A gateway's answer already given one, or a chunked one: the tenant gets this proxy's.
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"
    assert with_health_body(chunked, READY, NOT_READY).endswith(b"\r\n\r\n" + READY)


def test_a_failure_without_a_body_gets_the_not_ready_body_and_its_close() -> None:
    triton = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    answer = with_health_body(triton, READY, NOT_READY)
    assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert b"Connection: close\r\n" in answer
    assert answer.endswith(b"\r\n\r\n" + NOT_READY)


@pytest.mark.parametrize(
    "triton",
    [
        b"HTTP/1.1 400 Bad Request\r\nContent-Length: 35\r\nContent-Type: text/plain\r\n\r\n"
        b'{"error":"Model version not ready"}',
        b"HTTP/1.1 200 OK\r\nContent-Len",
        b"HTTP/9 200 OK\r\n\r\n",
        b"HTTP/1.1 304 Not Modified\r\n\r\n",
    ],
)
def test_an_error_with_a_body_or_an_unreadable_answer_passes_unchanged(triton: bytes) -> None:
    assert with_health_body(triton, READY, NOT_READY) == triton
