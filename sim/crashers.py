"""Python-backend models that kill the Triton serving them, standing in for a backend's crash bug.

A Python-backend stub is a process of its own: a crash in it only fails its load. Killing the
stub's parent, tritonserver, takes the whole server down, as a crashing backend library does.
Used by the crash quarantine's tests and benchmark, in a namespace allowed tenant code.
"""

from __future__ import annotations

_AT_LOAD = """import os
import signal


class TritonPythonModel:
    def initialize(self, args):
        os.kill(os.getppid(), signal.SIGKILL)

    def execute(self, requests):
        return []
"""

_LATER = """import os
import signal
import threading
import time


def _kill_later(parent):
    time.sleep({delay!r})  # its load is READY before: a timer, a warm-up thread, a leak
    os.kill(parent, signal.SIGKILL)


class TritonPythonModel:
    def initialize(self, args):
        threading.Thread(target=_kill_later, args=(os.getppid(),), daemon=True).start()

    def execute(self, requests):
        return []
"""


def load_killer(delay_seconds: float = 0.0) -> str:
    """The `model.py` of a model that kills Triton as it loads (`delay_seconds` 0), or that
    many seconds after its load began, from a thread (its load is READY meanwhile)."""
    if delay_seconds <= 0:
        return _AT_LOAD
    return _LATER.format(delay=float(delay_seconds))
