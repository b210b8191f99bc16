"""Loopback addresses that several simulated clusters of one machine hand out side by side: a
pod's IP is held with an flock on a file in `CLAIMS`, released when its descriptor is closed or
its process ends; a Service's cluster IP is never one held so; and an address where another
process already listens on a wanted port is passed over. The tests' workers run clusters side by
side; so may a developer.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import tempfile
from collections.abc import Iterable
from pathlib import Path

CLAIMS = Path(tempfile.gettempdir()) / "tritonshare-sim-pod-addresses"
"""One lock file per address that a simulated cluster of this machine holds."""


def claim(address: str) -> int | None:
    """An open descriptor holding `address`'s lock, or None when another holder has it (another
    process, or another claim of this one)."""
    CLAIMS.mkdir(exist_ok=True)
    descriptor = os.open(CLAIMS / address, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        return None
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(descriptor)
        raise
    return descriptor


def ports_free(address: str, ports: Iterable[int]) -> bool:
    """True when each of `ports` can be bound on `address` (as a server binds, SO_REUSEADDR)."""
    for port in ports:
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((address, port))
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    return False
                raise
    return True
