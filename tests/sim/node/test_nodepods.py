"""The kubelet's part in the node pods the simulated cluster runs itself (sim.node.nodepods): its
back-off, and a container that exits started again at once, then only after the back-off, each
exit kept with its code and the end of its log. The cluster's own node pods:
tests/sim/test_node_pod_restarts.py."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sim.node.nodepods import NodePodKubelet, Running, restart_delay
from sim.processes import wait_until

TEMPLATE = {"spec": {"containers": [{"name": "worker"}]}}
EXITS = "print('worker: giving up', flush=True); raise SystemExit(3)"


class OneContainer:
    """A node pod of one container whose process says a line and exits with code 3."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.processes: list[subprocess.Popen[bytes]] = []

    def container_run(self, node: str, container: str) -> Running | None:
        if not self.processes:
            return None
        return Running(self.processes[-1], self.log_path, {}, "127.0.0.1")

    def start_container_again(self, node: str, container: str) -> None:
        with self.log_path.open("ab") as out:
            self.processes.append(
                subprocess.Popen([sys.executable, "-c", EXITS], stdout=out, stderr=out)
            )

    def reap(self) -> None:
        for process in self.processes:
            process.wait(10)


@pytest.fixture
def pod(tmp_path: Path) -> Iterator[OneContainer]:
    one = OneContainer(tmp_path / "worker.log")
    try:
        yield one
    finally:
        one.reap()


def test_the_back_off_is_the_kubelet_s() -> None:
    delays = [restart_delay(n) for n in range(8)]
    assert delays == [0.0, 10.0, 20.0, 40.0, 80.0, 160.0, 300.0, 300.0]


def test_an_exit_is_started_again_at_once_the_next_after_the_back_off(pod: OneContainer) -> None:
    kubelet = NodePodKubelet(pod, ["node-a"], TEMPLATE)
    pod.start_container_again("node-a", "worker")
    kubelet.start()
    try:
        wait_until("two exits", lambda: len(kubelet.exits()) == 2, 20)
        # The second exit waits its 10 s of back-off: started again once so far.
        assert kubelet.restarts("node-a") == {"worker": 1}
        assert len(pod.processes) == 2
    finally:
        kubelet.stop()
    first, second = kubelet.exits()
    assert (first.node, first.container, first.returncode) == ("node-a", "worker", 3)
    assert first.reason == "", "it exited by itself"
    assert first.last_lines.endswith("worker: giving up")
    assert second.at > first.at
