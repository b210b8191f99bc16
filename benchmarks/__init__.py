"""Scripts that print figures side by side with a baseline (`python -m benchmarks.NAME`)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager


def command_line(name: str, description: str) -> argparse.ArgumentParser:
    """The command line of `python -m benchmarks.NAME`: its own usage line (argparse would say
    `NAME.py`, which no one can run) and a description of what it measures and how its main
    flags change that."""
    return argparse.ArgumentParser(prog=f"python -m benchmarks.{name}", description=description)


@contextmanager
def apiserver_process() -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """A simulated API server in its own process (`python -m sim.apiserver`, so its CPU and
    memory are its own): its URL and the process, stopped on leaving."""
    server = subprocess.Popen(
        [sys.executable, "-m", "sim.apiserver", "--port", "0", "--log-level", "WARNING"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        yield server.stdout.readline().rsplit(" ", 1)[1].strip(), server
    finally:
        server.terminate()
        server.wait(timeout=30)
        if server.stdout is not None:
            server.stdout.close()
