"""The node gateway under a keeper: its listening sockets outlive its process.

With `--keep-listening`, `python -m proxy.gateway` binds the REST and gRPC listeners itself, then
runs the gateway as its child under `common.keeper.Keeper`, which passes both sockets to each
start (their descriptors in `SOCKETS_ENV`) and starts the gateway again at once when it exits
(its delays, its give-up after so many exits in a row: then the container exits and the
kubelet's back-off takes over). While the gateway process is down (killed by the OOM killer, a
crash) the sockets still listen: the kernel queues a proxy's new connection in their backlog
instead of refusing it, and the next gateway accepts it and serves the request; requests at
the dead process when it died are lost with their connections, as they are at any exit. Each
exit is logged at WARNING by the keeper (the gateway's own traceback is in the log above it),
and `tritonshare_gateway_process_starts` counts the starts.

SIGTERM or SIGINT close the keeper's copies of the sockets and go to the gateway, which stops as
without a keeper (the port refuses once it has closed its own). The gateway watches the keeper
(`watch_keeper`: the read end of a pipe whose write end only the keeper holds) and stops the same
way when the keeper is gone, so that no gateway outlives its container's main process.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from common.keeper import STARTS_ENV, Keeper
from proxy.gateway.settings import GatewaySettings
from proxy.settings import SettingsError
from proxy.sockets import bind

log = logging.getLogger("gateway")

SOCKETS_ENV = "TRITONSHARE_GATEWAY_SOCKETS"
"""`http=FD,grpc=FD,keeper=FD`: the listening sockets a kept gateway serves on, and the pipe by
which it knows its keeper is alive."""
PROTOCOLS = ("http", "grpc")
BACKLOG = 1024
"""Connections the kernel queues on a listener until they are accepted (also while no gateway
process runs)."""
PROCESS_NAME = "the gateway's process"
"""How the keeper's lines name the process it keeps."""


@dataclass
class Kept:
    """What a kept gateway inherits from its keeper (none of it without one)."""

    listening: dict[str, socket.socket] = field(default_factory=dict)
    keeper: int | None = None
    """The read end of the keeper's pipe: at its end of file the keeper is gone."""
    starts: int = 1
    """Which start of the gateway this is (1: its first)."""


def keep(settings: GatewaySettings, argv: Sequence[str]) -> int:
    """Listen on the REST and gRPC addresses, then run `python -m proxy.gateway ARGV` under a
    keeper that passes the sockets to each start; the keeper's exit code."""
    listening = {}
    for protocol, (host, port) in zip(
        PROTOCOLS, (settings.listen_http, settings.listen_grpc), strict=True
    ):
        sock = bind(host, port)
        sock.listen(BACKLOG)
        listening[protocol] = sock
    alive, held = os.pipe()  # the keeper holds `held` open until it exits
    given = [f"{protocol}={sock.fileno()}" for protocol, sock in listening.items()]
    env = {**os.environ, SOCKETS_ENV: ",".join([*given, f"keeper={alive}"])}
    keeper = Keeper(
        # -P as this process has it: `python -m` then imports the gateway from where it did.
        [sys.executable, *(["-P"] if sys.flags.safe_path else []), "-m", "proxy.gateway", *argv],
        own_group=False,
        pass_fds=[*(sock.fileno() for sock in listening.values()), alive],
        env=env,
        say=lambda words: log.warning("%s", words),
        name=PROCESS_NAME,
    )

    def stop(signum: int, _frame: object = None) -> None:
        # The kernel would otherwise go on queueing connections that nobody will accept.
        for sock in listening.values():
            sock.close()
        keeper.stop(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)
    log.info(
        "Listening on REST port %d and gRPC port %d; the gateway runs under a keeper that "
        "starts it again at once when it exits.",
        listening["http"].getsockname()[1],
        listening["grpc"].getsockname()[1],
    )
    try:
        return keeper.run()
    finally:
        os.close(held)


def kept(environ: Mapping[str, str]) -> Kept:
    """What the keeper passed this process (an empty `Kept` when it runs without one)."""
    starts = environ.get(STARTS_ENV, "1")
    given = environ.get(SOCKETS_ENV)
    if given is None:
        return Kept()
    descriptors: dict[str, int] = {}
    for part in given.split(","):
        name, _, number = part.partition("=")
        if name not in (*PROTOCOLS, "keeper") or not number.isdigit():
            raise SettingsError(
                f"{SOCKETS_ENV}={given!r}: expected http=FD,grpc=FD,keeper=FD as the gateway's "
                "keeper sets it; unset it to run the gateway on its own"
            )
        descriptors[name] = int(number)
    if set(descriptors) != {*PROTOCOLS, "keeper"}:
        raise SettingsError(f"{SOCKETS_ENV}={given!r} lacks one of http, grpc and keeper")
    listening = {}
    for protocol in PROTOCOLS:
        try:
            sock = socket.socket(fileno=descriptors[protocol])
        except OSError as e:
            raise SettingsError(
                f"{SOCKETS_ENV}: descriptor {descriptors[protocol]} for {protocol} is no socket "
                f"({e}); unset it to run the gateway on its own"
            ) from e
        listening[protocol] = sock
    return Kept(listening, descriptors["keeper"], int(starts) if starts.isdigit() else 1)


def watch_keeper(descriptor: int) -> threading.Thread:
    """Stop this process as SIGTERM does once its keeper is gone (its pipe's end of file)."""

    def watch() -> None:
        while True:
            try:
                if not os.read(descriptor, 1):
                    break
            except InterruptedError:  # pragma: no cover - retried by Python itself
                continue
            except OSError:
                break
        log.error("The gateway's keeper exited: the gateway stops.")
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=watch, name="the keeper watch", daemon=True)
    thread.start()
    return thread
