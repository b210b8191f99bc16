"""One REST request that crashes the shared Triton (issue 23's independent attack suite, run by us
first): a hole left open, written down as a strict xfail.

Triton 2.51 parses a REST inference body's JSON recursively: nested past about 100,000 to 200,000
levels it overflows its stack and the whole process dies with SIGSEGV, every tenant's model with
it (measured straight at Triton, scratch: `{"inputs": {"a": {"a": ...}}}` 100,000 deep answered
400; 200,000 deep, a 1 MB body, killed it; arrays, `[[[...]]]`, 100,000 deep answered and 5,000,000
deep killed it). The gateway and the proxy forward inference bodies as they come, checking only
their size (`--max-body`, 1 GiB), so a proven pod kills its node's Triton with one request a
megabyte long, as often as Triton comes back. The test runs its own Triton (it must not take the
suite's shared one down) behind a real gateway process, and the attacker is a proven pod calling
from its own address.

The fix belongs in the REST relay (`proxy/http1/relay.py`, shared by the proxy and the gateway):
bound the nesting of the JSON a forwarded body holds (the JSON header only, with the binary tensor
extension; the inflated bytes of a compressed body), where a count of the openings a piece holds
(`bytes.count`, C speed) is enough while the count stays under the bound and a scan of the piece's
brackets is needed only past it; measured against the proxy benchmarks, since it is on every
request's path. See docs/security.md, "What remains open".
"""

from __future__ import annotations

import json
import socket
import subprocess
import urllib.request
from pathlib import Path

import pytest

from sim.triton import TritonServer
from tests.conftest import copy_model
from tests.proxy.gateway.conftest import caller, publish
from tests.proxy.gateway.test_inflate_attacks import ATTACKER, gateway_process

pytestmark = pytest.mark.triton

DEPTH = 300_000
"""Levels of nesting: past what Triton's parser survives (a 1.5 MB body)."""


@pytest.mark.xfail(
    strict=True,
    reason="the REST relay forwards a deeply nested JSON body and Triton 2.51 dies of it "
    "(SIGSEGV); the relay must bound a body's JSON nesting (docs/security.md, What remains open)",
)
def test_a_deeply_nested_json_body_cannot_crash_triton(
    triton: TritonServer, model_repository: Path, tmp_path: Path
) -> None:
    copy_model("identity", model_repository)
    load = urllib.request.Request(
        f"http://{triton.http_url}/v2/repository/models/identity/load", method="POST"
    )
    with urllib.request.urlopen(load, timeout=60) as answer:
        assert answer.status == 200
    table = tmp_path / "callers.json"
    publish(table, caller(ATTACKER, "identity", "a/crash"))
    body = b'{"inputs":' + b'{"a":' * DEPTH + b"1" + b"}" * DEPTH + b"}"
    with gateway_process(triton, table) as gateway:
        host, port = gateway.http_url.split(":")
        with socket.create_connection((host, int(port)), source_address=(ATTACKER, 0)) as sock:
            sock.settimeout(30)
            head = (
                f"POST /v2/models/identity/infer HTTP/1.1\r\nHost: gateway\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            )
            sock.sendall(head.encode() + body)
            answer = sock.recv(65536)
        assert triton.process is not None
        try:  # a crash takes a moment to end the process
            code: int | None = triton.process.wait(3)
        except subprocess.TimeoutExpired:
            code = None
    assert code is None, f"Triton died (exit {code}); the tenant got {answer[:120]!r}"
    assert answer.startswith(b"HTTP/1.1 4"), answer[:200]
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1] or b"{}") is not None
