"""Triton's processes as `/proc` shows them: the tree under Triton's PID (the server and its
children, such as Python backend stubs), the resident memory it holds, and which model each stub
runs.

The only module that reads `/proc`. Triton's PID comes from `--triton-pid-file`, which Triton's
container writes; the PIDs are those of the agent's PID namespace, so the node pod shares one
(`shareProcessNamespace`). Without the file nothing here is known, and callers say so. It must
not call NVML or Triton.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
STUB_NAME = b"triton_python_backend_stub"
"""The Python backend's stub: one process per model instance."""


def _under(root: int, children: dict[int, list[int]]) -> set[int]:
    """`root` and every process under it."""
    pids, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in pids:
                pids.add(child)
                todo.append(child)
    return pids


@dataclass(frozen=True)
class TritonTree:
    """Triton's processes at one moment and the memory they hold."""

    pids: frozenset[int]
    rss: int
    """Bytes resident, summed over the processes (shared pages count once per process)."""
    models: Mapping[str, int] = field(default_factory=dict)
    """Of `rss`, what each model's own processes hold (its Python backend stubs and what runs
    under them), by its name in Triton."""

    @property
    def own(self) -> int:
        """Of `rss`, what Triton's own processes hold: the tree less the models' processes."""
        return self.rss - sum(self.models.values())


class TritonProcesses:
    """Reads Triton's process tree; `pid_file` None means Triton's PID is not known."""

    def __init__(self, pid_file: Path | None, *, proc: Path = Path("/proc")) -> None:
        self.pid_file = pid_file
        self._proc = proc
        self._warned = ""

    @property
    def known(self) -> bool:
        return self.pid_file is not None

    def root(self) -> int | None:
        """Triton's PID, or None when the file is not there (yet) or names no live process."""
        if self.pid_file is None:
            return None
        try:
            pid = int(self.pid_file.read_text().split()[0])
        except (OSError, ValueError, IndexError) as e:
            self._warn(f"cannot read Triton's PID from {self.pid_file} ({e})")
            return None
        if not (self._proc / str(pid)).is_dir():
            self._warn(f"Triton's PID {pid} from {self.pid_file} names no process the agent sees")
            return None
        self._warned = ""
        return pid

    def tree(self) -> TritonTree | None:
        """Triton's processes now, None when Triton's PID is not known."""
        root = self.root()
        if root is None:
            return None
        children = self._children()
        rss = {pid: self._rss(pid) for pid in _under(root, children)}
        models = {
            name: sum(rss.get(pid, 0) for pid in pids)
            for name, pids in self._models_under(root, children).items()
        }
        return TritonTree(frozenset(rss), sum(rss.values()), models)

    def by_model(self) -> dict[str, frozenset[int]] | None:
        """Each model's processes by its name in Triton: every Python backend stub in Triton's
        tree (its command line is `triton_python_backend_stub <repository>/<name>/<version>/
        model.py ...`) with the processes under it; None when Triton's PID is not known."""
        root = self.root()
        if root is None:
            return None
        return self._models_under(root, self._children())

    def _models_under(self, root: int, children: dict[int, list[int]]) -> dict[str, frozenset[int]]:
        found: dict[str, set[int]] = {}
        todo = [root]
        while todo:
            pid = todo.pop()
            model = self._stub_model(pid) if pid != root else ""
            if model:
                found.setdefault(model, set()).update(_under(pid, children))
            else:
                todo.extend(children.get(pid, ()))
        return {name: frozenset(pids) for name, pids in found.items()}

    def _stub_model(self, pid: int) -> str:
        """The model a Python backend stub runs ("" when `pid` is no stub)."""
        try:
            argv = (self._proc / str(pid) / "cmdline").read_bytes().split(b"\0")
        except OSError:
            return ""
        if len(argv) < 2 or not argv[0].endswith(STUB_NAME):
            return ""
        parts = Path(argv[1].decode(errors="replace")).parts
        return parts[-3] if len(parts) >= 3 else ""

    def _children(self) -> dict[int, list[int]]:
        children: dict[int, list[int]] = {}
        for entry in self._proc.iterdir():
            if not entry.name.isdigit():
                continue
            parent = self._parent(entry)
            if parent is not None:
                children.setdefault(parent, []).append(int(entry.name))
        return children

    def memory_limit(self, cgroup_root: Path = Path("/sys/fs/cgroup")) -> int | None:
        """The memory limit of Triton's cgroup (v2 `memory.max`), where the agent can read it;
        None when Triton's PID is not known, its cgroup is outside the agent's cgroup
        namespace, or it has no limit."""
        root = self.root()
        if root is None:
            return None
        try:
            lines = (self._proc / str(root) / "cgroup").read_text().splitlines()
        except OSError:
            return None
        for line in lines:
            if not line.startswith("0::"):
                continue
            where = line[3:].strip()
            if ".." in where.split("/"):
                return None
            try:
                text = (cgroup_root / where.lstrip("/") / "memory.max").read_text().strip()
            except OSError:
                return None
            return int(text) if text.isdigit() else None
        return None

    def _parent(self, entry: Path) -> int | None:
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            return None  # gone meanwhile
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        fields = stat[stat.rfind(")") + 2 :].split()
        return int(fields[1]) if len(fields) > 1 else None

    def _rss(self, pid: int) -> int:
        try:
            return int((self._proc / str(pid) / "statm").read_text().split()[1]) * PAGE_BYTES
        except (OSError, ValueError, IndexError):
            return 0  # gone meanwhile

    def _warn(self, message: str) -> None:
        if message != self._warned:
            log.warning(
                "%s: Triton's processes and host memory are not known until it does.", message
            )
            self._warned = message
