"""The keeper: a container's main process, which starts its command again at once when it dies,
rather than leave the restart to the kubelet's CrashLoopBackOff.

Triton's container runs `tritonserver` under it: a model can kill Triton (a backend's crash as it
loads or serves); the crash quarantine needs a few exits to name it, and the kubelet waits 10 s
before a container's second restart, then 20, 40, up to 5 minutes, with every model of the node
down meanwhile. The node gateway runs itself under it (`proxy.gateway.keep`), holding its
listening sockets across its own restarts (`pass_fds`).

The keeper starts the command (in a process group of its own, `own_group`, or in the keeper's),
and when it exits ends what it left in its own group (Triton's backend stubs, which hold its
sockets), as the container runtime would, then starts it again and says so (`say`; on its output
by default). A server that ran `BRIEF_SECONDS` or more (it started, then a model or a request
killed it: the agent's crash quarantine bounds those exits) starts again at once, since every
model of the node waits for it; one that died sooner, as a server that cannot start does, after
`DELAYS` (at once, then 1, 2, 4 and 8 s: within a liveness probe's 30 s) by such exits in a row.
Each start's environment says which start it is (`STARTS_ENV`: 1, 2, ...). After
`GIVE_UP_AFTER` exits in a row, none of them after `SETTLED_SECONDS` of running, it exits with
the command's status and the kubelet's back-off takes over. SIGTERM or SIGINT go to the command
(its group); once it has stopped the keeper exits with its status and starts nothing.

It runs in Triton's image with that image's `python3` (copied there with the NVML relay by the
node pod's init container): the standard library only, and nothing of tritonshare.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence

STARTS_ENV = "TRITONSHARE_KEEPER_STARTS"
"""The environment variable that tells the command which start of it this is (1 the first)."""
DELAYS = (0.0, 1.0, 2.0, 4.0, 8.0)
"""Seconds before the server starts again after its 1st, 2nd, ... brief exit in a row (the last
one for every later exit)."""
BRIEF_SECONDS = 2.0
"""A server that ran less than this before it exited is backed off (`DELAYS`), as one that cannot
start is (Triton fails on its flags, ports or repository within it); one that ran longer served or
loaded models, and the exits a model causes are bounded by the agent's crash quarantine."""
SETTLED_SECONDS = 60.0
"""A server that ran this long before it exited starts the count of exits in a row afresh."""
GIVE_UP_AFTER = 10
"""Exits in a row after which the keeper exits itself, with the server's status."""
POLL_SECONDS = 0.1


def say(message: str) -> None:
    print(f"tritonshare-keeper: {message}", flush=True)


def status_words(status: int) -> str:
    """A `Popen.returncode` in words."""
    if status < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-status).name}"
        return f"signal {-status}"
    return f"exit code {status}"


def exit_status(status: int) -> int:
    """The keeper's own exit status for the server's `status`, as a shell gives it."""
    return 128 - status if status < 0 else status


class Keeper:
    """Runs `command` until told to stop, starting it again after each exit."""

    def __init__(
        self,
        command: Sequence[str],
        *,
        delays: Sequence[float] = DELAYS,
        settled_seconds: float = SETTLED_SECONDS,
        brief_seconds: float = BRIEF_SECONDS,
        give_up_after: int = GIVE_UP_AFTER,
        own_group: bool = True,
        pass_fds: Sequence[int] = (),
        env: Mapping[str, str] | None = None,
        say: Callable[[str], None] = say,
        name: str = "",
    ) -> None:
        self.command = list(command)
        self.name = name or self.command[0]
        """How its lines name the command (its program by default)."""
        self.own_group = own_group
        """Whether the command runs in a process group of its own, ended with it when it exits;
        else in the keeper's (a signal to the keeper's group reaches it too)."""
        self.pass_fds = tuple(pass_fds)
        """Descriptors the command inherits at each start (the keeper keeps them open)."""
        self.env = env
        self.say = say
        self.delays = tuple(delays)
        self.settled_seconds = settled_seconds
        self.brief_seconds = brief_seconds
        self.give_up_after = give_up_after
        self.stopping = 0
        """The signal that asked the keeper to stop (0: none)."""
        self.server: subprocess.Popen[bytes] | None = None

    def stop(self, signum: int, _frame: object = None) -> None:
        """A stop signal: pass it to the server's group; once it has stopped, exit."""
        self.stopping = signum
        server = self.server
        if server is not None and server.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if self.own_group:
                    os.killpg(server.pid, signum)
                else:
                    os.kill(server.pid, signum)

    def run(self) -> int:
        """Keep the server running; the keeper's exit status."""
        in_a_row = brief_in_a_row = 0
        for start in itertools.count(1):
            started = time.monotonic()
            env = dict(os.environ if self.env is None else self.env)
            env[STARTS_ENV] = str(start)
            try:
                # A process group of its own (in the keeper's session), ended when it exits;
                # set between fork and exec without running Python there (no preexec_fn: a
                # process with gRPC's threads may abort in a forked child that runs Python).
                self.server = subprocess.Popen(
                    self.command,
                    process_group=0 if self.own_group else None,
                    pass_fds=self.pass_fds,
                    env=env,
                )
            except OSError as e:
                self.say(f"cannot start {self.name} ({e})")
                return 127
            if self.stopping:
                self.stop(self.stopping)  # the signal came while it started
            status = self._wait(self.server, self.own_group)
            ran = time.monotonic() - started
            if self.stopping:
                self.say(f"{self.name} stopped ({status_words(status)}) after {ran:.1f} s")
                return exit_status(status)
            in_a_row = 1 if ran >= self.settled_seconds else in_a_row + 1
            if in_a_row >= self.give_up_after:
                self.say(
                    f"{self.name} exited ({status_words(status)}) after {ran:.1f} s, "
                    f"{in_a_row} times in a row: leaving its restarts to the kubelet"
                )
                return exit_status(status)
            brief_in_a_row = brief_in_a_row + 1 if ran < self.brief_seconds else 0
            delay = self.delays[min(brief_in_a_row, len(self.delays)) - 1] if brief_in_a_row else 0
            ended = "; its other processes are ended" if self.own_group else ""
            self.say(
                f"{self.name} exited ({status_words(status)}) after {ran:.1f} s{ended}; starting "
                f"it again in {delay:g} s ({in_a_row} exits in a row; at {self.give_up_after} the "
                "container exits)"
            )
            deadline = time.monotonic() + delay
            while not self.stopped() and time.monotonic() < deadline:
                time.sleep(min(POLL_SECONDS, max(0.0, deadline - time.monotonic())))
            if self.stopped():
                return exit_status(status)
        raise AssertionError("unreachable: the loop above only returns")  # pragma: no cover

    def stopped(self) -> bool:
        """Whether a stop signal came (its handler runs between any two lines of `run`)."""
        return self.stopping != 0

    @staticmethod
    def _wait(server: subprocess.Popen[bytes], own_group: bool) -> int:
        """Wait for the server to exit, end what is left of its own process group, and return
        its status. The exit is waited for without collecting it first, so the group's id (the
        server's PID) cannot be taken by another process before the group is ended."""
        with contextlib.suppress(ChildProcessError):
            os.waitid(os.P_PID, server.pid, os.WEXITED | os.WNOWAIT)  # a signal: retried
        if own_group:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(server.pid, signal.SIGKILL)
        return server.wait()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="keeper",
        description="Run a command (tritonserver) and start it again at once when it exits, "
        "ending what it left in its process group; SIGTERM stops it and the keeper.",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG ...]")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to keep after --")
    keeper = Keeper(command)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, keeper.stop)
    return keeper.run()


if __name__ == "__main__":
    sys.exit(main())
