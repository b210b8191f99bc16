"""What a tenant connection keeps of the header blocks it sent: its decoder's kept blocks, its
plans and its last plan, whatever the blocks decode to, and all of it counted in `held_bytes`
(the node's byte budget reads it), measured with tracemalloc on an in-process relay."""

from __future__ import annotations

import gc
import tracemalloc

from proxy.gateway.budget import CONNECTION_BYTES
from proxy.http2 import frames as f
from proxy.http2.headers import KEPT_BYTES, KEPT_ENTRY_BYTES
from tests.proxy.grpc.rig import Rig

_SLACK = 16 * 1024
"""What the connection may hold past what it counts: its dicts' own tables, the reset frames
written and the closed streams' table (a few KiB), far under one list of 1,720 fields (124 KiB)."""


def long_block(variant: int) -> bytes:
    """1,720 bytes that decode to 1,720 fields (`:path: /`, just under the 64 KiB header-list
    bound), the first 7 telling variants apart: a distinct malformed request each, planned
    (and refused) like any other."""
    pattern = bytes(0x84 | ((variant >> bit) & 1) for bit in range(7))
    return pattern + b"\x84" * (1720 - len(pattern))


async def test_a_connection_keeps_no_more_of_its_header_blocks_than_held_bytes_counts() -> None:
    """Before, 63 distinct lists of 1,720 fields each left their plan kept (about 8 MiB a
    connection, counted nowhere), and a refused list stayed held as the last plan."""
    rig = Rig()
    tenant, out = rig.tenant()
    rig.call(tenant, 1, b"")  # a real client's head: planned and kept, as the last plan
    out.take()
    counted_before = tenant.held_bytes()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(63):  # with the real head, as many plans as were kept before
            block = long_block(i)
            tenant.data_received(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 3 + 2 * i, block))
            rig.relay.flush()
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    resets = [frame for frame in out.take() if frame[0] == f.RST_STREAM]
    assert len(resets) == 63  # every block decoded and its request refused
    counted = tenant.held_bytes()
    assert counted <= 2 * KEPT_BYTES + KEPT_ENTRY_BYTES + _SLACK < CONNECTION_BYTES
    assert grown <= counted - counted_before + _SLACK, f"{grown} bytes held, {counted} counted"
