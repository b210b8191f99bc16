"""The processes below a process, read from the kernel's per-thread child lists.

The leak guard asks this twice for every test. psutil's `children(recursive=True)` reads the
parent of every process on the machine (all of /proc) to find them, tens of milliseconds on a
shared, busy box; `/proc/<pid>/task/<tid>/children` names a process's own children directly, so
the cost follows the size of the test's own tree. Where the kernel lacks those files
(CONFIG_PROC_CHILDREN), psutil's walk answers instead.
"""

from __future__ import annotations

import os
from pathlib import Path

import psutil

PROC = Path("/proc")


def _children_files_exist() -> bool:
    me = os.getpid()
    return (PROC / str(me) / "task" / str(me) / "children").exists()


CHILDREN_FILES = _children_files_exist()
"""Whether this kernel lists each thread's children in /proc (checked once, at import)."""


def _children(pid: int) -> list[int]:
    """The children of `pid` (forked by any of its threads); none if it has exited."""
    try:
        tasks = list((PROC / str(pid) / "task").iterdir())
    except OSError:
        return []
    kids: list[int] = []
    for task in tasks:
        try:
            kids += map(int, (task / "children").read_text().split())
        except OSError:  # the thread ended meanwhile
            continue
    return kids


def descendant_pids(pid: int) -> set[int]:
    """The pids of every process below `pid`: its children, theirs, and so on (empty if it has
    exited). A process that exits or starts while the tree is read may or may not be in it, as
    with any reading of /proc."""
    if not CHILDREN_FILES:
        try:
            return {p.pid for p in psutil.Process(pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            return set()
    found: set[int] = set()
    stack = [pid]
    while stack:
        for kid in _children(stack.pop()):
            if kid not in found:
                found.add(kid)
                stack.append(kid)
    return found
