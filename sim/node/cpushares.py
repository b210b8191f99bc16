"""Each pod's processes in a CPU cgroup weighted by its CPU requests, as a kubelet places them.

On a real node the kubelet puts every pod in a cgroup whose CPU weight follows the pod's CPU
requests, so when the node's CPUs are contended each pod gets CPU in proportion to what it
requested: a tenant's busy client cannot take the node pod's CPU, whatever it runs. A simulation
whose processes all share one scheduler entity measures something no real node shows (a tenant's
flood taking a core from Triton and the gateway). `CpuGroups` gives the simulated node the same
weights: a cgroup per pod under one directory of this simulation's own, `cpu.shares` (cgroup v1)
or `cpu.weight` (cgroup v2) from the kubelet's arithmetic (`shares`), processes moved in by pid
(their children inherit the group), and a container's CPU limit as a CFS quota, as the runtime
sets it (none of the parts' manifests sets one). Off unless asked for
(`SimCluster(cpu_shares=True)`): it needs a writable cgroup CPU controller, which containers and
CI machines often do not give, and tests do not need it.

What it must not do: decide which pod a process belongs to (the kubelet and the cluster say), or
leave anything behind (`close` moves every process back and removes every group).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from common.quantity import quantity_decimal

log = logging.getLogger(__name__)

MIN_SHARES: Final = 2
MAX_SHARES: Final = 262144
"""The kubelet's bounds on cpu.shares (pkg/kubelet/cm: MinShares, MaxShares)."""
SHARES_PER_CPU: Final = 1024
QUOTA_PERIOD_US: Final = 100_000
"""The CFS period the kubelet uses for CPU limits (100 ms)."""

_V1_ROOT: Final = Path("/sys/fs/cgroup/cpu")
_V2_ROOT: Final = Path("/sys/fs/cgroup")


class CpuGroupsUnavailableError(RuntimeError):
    """This machine gives no writable cgroup CPU controller."""


def millicpu(quantity: str) -> int:
    """A CPU quantity (`2`, `500m`, `0.25`) in thousandths of a CPU, rounded up as Kubernetes
    rounds CPU requests up to the millicore."""
    value = quantity_decimal(quantity.strip())
    if value is None or value < 0:
        raise ValueError(f"CPU request {quantity!r} is not a quantity; write e.g. '500m' or '2'")
    thousandths = value * 1000
    return int(thousandths.to_integral_value(rounding="ROUND_CEILING"))


def container_millicpu(container: Mapping[str, Any], kind: str = "requests") -> int:
    """The container's CPU `requests` (or `limits`) in millicpus; 0 where it states none."""
    cpu = container.get("resources", {}).get(kind, {}).get("cpu")
    return 0 if cpu is None else millicpu(str(cpu))


def pod_millicpu(pod: Mapping[str, Any]) -> int:
    """The pod's effective CPU request: the sum over its containers, or the largest init
    container's if that is more (init containers run one at a time, before the others)."""
    spec = pod.get("spec", {})
    main = sum(container_millicpu(c) for c in spec.get("containers", []))
    inits = [container_millicpu(c) for c in spec.get("initContainers", [])]
    return max([main, *inits])


def shares(millicpus: int) -> int:
    """cpu.shares for a CPU request of `millicpus`, as the kubelet computes it (a pod requesting
    nothing, BestEffort, gets the minimum)."""
    return max(MIN_SHARES, min(MAX_SHARES, millicpus * SHARES_PER_CPU // 1000))


def weight(cpu_shares: int) -> int:
    """cgroup v2 cpu.weight for cpu.shares, the conversion the kubelet and runc use."""
    return 1 + ((cpu_shares - MIN_SHARES) * 9999) // (MAX_SHARES - MIN_SHARES)


class CpuGroups:
    """The CPU cgroups of one simulation: a directory of its own under the CPU controller, one
    group per pod (or per process of the node pod) inside it."""

    def __init__(self, name: str, root: Path | None = None) -> None:
        self._v2 = False
        if root is None:
            root, self._v2 = _controller()
        self.path = root / f"{name}-{os.getpid()}"
        self._groups: dict[str, Path] = {}
        try:
            self.path.mkdir(exist_ok=True)
            if self._v2:
                (self.path / "cgroup.subtree_control").write_text("+cpu")
        except OSError as e:
            raise CpuGroupsUnavailableError(
                f"cannot make a CPU cgroup at {self.path} ({e.strerror}): weighting pods' CPU "
                "as a kubelet does needs a writable cgroup CPU controller (root, and a container "
                "that mounts /sys/fs/cgroup read-write); run without it"
            ) from e

    def place(
        self, group: str, millicpus: int, pids: Sequence[int] = (), *, limit: int = 0
    ) -> None:
        """Put `pids` (and what they start from now on) in `group`, weighted for a CPU request of
        `millicpus` and, with `limit` (millicpus), held to that much CPU time per period as a
        container's CPU limit holds it (CFS quota); the group is made on first use and its
        weight and limit follow the latest call. `pod/container` nests a container's group in
        its pod's, as the kubelet and the runtime do (the pod's group first; processes go in the
        innermost groups only)."""
        path = self._groups.get(group)
        if path is None:
            parent, _, _ = group.rpartition("/")
            if parent and parent not in self._groups:
                raise ValueError(f"place {parent!r} before {group!r}")
            path = self._groups[parent] / group.rpartition("/")[2] if parent else self.path / group
            path.mkdir(exist_ok=True)
            self._groups[group] = path
            if parent and self._v2:
                (self._groups[parent] / "cgroup.subtree_control").write_text("+cpu")
        if self._v2:
            (path / "cpu.weight").write_text(str(weight(shares(millicpus))))
        else:
            (path / "cpu.shares").write_text(str(shares(millicpus)))
        quota = limit * QUOTA_PERIOD_US // 1000 if limit > 0 else -1
        if self._v2:
            (path / "cpu.max").write_text(f"{quota if quota > 0 else 'max'} {QUOTA_PERIOD_US}")
        else:
            (path / "cpu.cfs_period_us").write_text(str(QUOTA_PERIOD_US))
            (path / "cpu.cfs_quota_us").write_text(str(quota))
        for pid in pids:
            # A process that has already ended has nothing left to weight.
            with contextlib.suppress(ProcessLookupError):
                _move(path, pid)

    def weight_of(self, group: str) -> int:
        """The weight the group has now (cpu.shares on v1, cpu.weight on v2)."""
        name = "cpu.weight" if self._v2 else "cpu.shares"
        return int((self._groups[group] / name).read_text())

    def limit_of(self, group: str) -> int:
        """The group's CPU limit in millicpus (0: none)."""
        path = self._groups[group]
        if self._v2:
            quota, period = (path / "cpu.max").read_text().split()
        else:
            quota = (path / "cpu.cfs_quota_us").read_text().strip()
            period = (path / "cpu.cfs_period_us").read_text().strip()
        return 0 if quota in ("max", "-1") else int(quota) * 1000 // int(period)

    def pids(self, group: str) -> set[int]:
        """The processes in `group` now."""
        text = (self._groups[group] / "cgroup.procs").read_text()
        return {int(line) for line in text.split()}

    def forget(self, group: str) -> None:
        """Remove a group and those inside it whose processes have all ended (any still running
        keeps its group, and the groups around it)."""
        for name in sorted(self._inside(group), key=len, reverse=True):
            if _removed(self._groups[name]):
                del self._groups[name]

    def _inside(self, group: str) -> list[str]:
        return [g for g in self._groups if g == group or g.startswith(group + "/")]

    def close(self) -> None:
        """Move every process still in a group back to the parent and remove every group."""
        parent = self.path.parent
        for path in [*self._groups.values(), self.path]:
            with contextlib.suppress(OSError):
                for line in (path / "cgroup.procs").read_text().split():
                    with contextlib.suppress(OSError):
                        _move(parent, int(line))
        # Inner groups first: a group with groups inside cannot be removed.
        for path in sorted(self._groups.values(), key=lambda p: len(p.parts), reverse=True):
            _removed(path)
        self._groups.clear()
        if not _removed(self.path):
            log.warning("The CPU cgroup %s could not be removed; remove it by hand.", self.path)


def _controller() -> tuple[Path, bool]:
    """Where this machine's CPU controller is: cgroup v1's cpu hierarchy, or v2's unified tree
    with the cpu controller available (True)."""
    if (_V1_ROOT / "cpu.shares").exists():
        return _V1_ROOT, False
    controllers = _V2_ROOT / "cgroup.controllers"
    if controllers.exists() and "cpu" in controllers.read_text().split():
        return _V2_ROOT, True
    raise CpuGroupsUnavailableError(
        "this machine has no cgroup CPU controller (neither /sys/fs/cgroup/cpu nor cgroup v2 "
        "with cpu): pods' CPU cannot be weighted as a kubelet does; run without it"
    )


def _move(path: Path, pid: int) -> None:
    try:
        (path / "cgroup.procs").write_text(str(pid))
    except OSError as e:
        # The kernel answers ESRCH for a pid that has gone.
        if e.errno == 3:
            raise ProcessLookupError(pid) from e
        raise


def _removed(path: Path) -> bool:
    try:
        path.rmdir()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True
