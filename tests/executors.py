"""An executor for tests of parts that run blocking calls on an executor the agent gives them."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class CallerThread(Executor):
    """Runs each call at once on the thread that submits it: a test's NVML reads (of the mock)
    need no thread of their own, and nothing is left running after the test."""

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        future: Future[T] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as e:
            future.set_exception(e)
        return future
