"""A simulated node weights its pods' CPU by their requests, as a kubelet does (sim.node.cpushares).

The arithmetic is the kubelet's; the cgroups are real where the machine lets this process write
its CPU controller (root with /sys/fs/cgroup writable): a pod's container lands in its pod's group
with the pod's weight, and two busy processes sharing one CPU get it in proportion to their
groups' weights. Elsewhere those tests skip: a writable cgroup is a permission of the machine,
not a tool `.ci/run` could install.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest

from sim.apiserver import RunningApiServer
from sim.cluster import node_container_millicpu, node_pod_template
from sim.node.cpushares import (
    CpuGroups,
    CpuGroupsUnavailableError,
    millicpu,
    pod_millicpu,
    shares,
    weight,
)
from sim.node.kubelet import Kubelet
from tests.sim.node.test_kubelet import NODE, create, pod_manifest, read, wait_for

SPIN = "import time\nend = time.monotonic() + 30\nwhile time.monotonic() < end: pass"


def test_cpu_quantities_read_as_kubernetes_reads_them() -> None:
    assert [millicpu(q) for q in ("2", "500m", "0.25", "100m", "1.0001", "0")] == [
        2000,
        500,
        250,
        100,
        1001,  # rounded up to the millicore
        0,
    ]
    for bad in ("", "two", "-1", "1cpu", "٢"):
        with pytest.raises(ValueError, match="not a quantity"):
            millicpu(bad)


def test_shares_and_weights_follow_the_kubelets_arithmetic() -> None:
    # pkg/kubelet/cm MilliCPUToShares: BestEffort gets 2, 1 CPU 1024, capped at 262144.
    assert [shares(m) for m in (0, 1, 100, 1000, 2600, 10**9)] == [2, 2, 102, 1024, 2662, 262144]
    # runc's and the kubelet's shares -> cpu.weight.
    assert [weight(s) for s in (2, 1024, 262144)] == [1, 39, 10000]


def test_a_pods_request_is_its_containers_sum_or_its_largest_init_container() -> None:
    def container(cpu: str | None) -> dict[str, Any]:
        return {"resources": {"requests": {"cpu": cpu}}} if cpu else {}

    pod = {"spec": {"containers": [container("250m"), container("1"), container(None)]}}
    assert pod_millicpu(pod) == 1250
    pod["spec"]["initContainers"] = [container("2")]
    assert pod_millicpu(pod) == 2000
    assert pod_millicpu({"spec": {}}) == 0


def test_the_node_pods_weights_come_from_the_daemonset_it_deploys() -> None:
    template = node_pod_template()
    names = ("triton", "agent", "gateway")
    parts = {name: node_container_millicpu(template, name) for name in names}
    assert all(parts.values()), parts
    assert pod_millicpu(template) >= sum(parts.values())
    with pytest.raises(ValueError, match="no container 'nope'"):
        node_container_millicpu(template, "nope")


@pytest.fixture
def groups() -> Iterator[CpuGroups]:
    try:
        made = CpuGroups(f"tritonshare-test-{time.monotonic_ns()}")
    except CpuGroupsUnavailableError as e:
        pytest.skip(f"no writable cgroup CPU controller here: {e}")
    try:
        yield made
    finally:
        made.close()
    assert not made.path.exists(), "close() left the simulation's cgroup behind"


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_two_busy_processes_on_one_cpu_share_it_by_their_groups_weights(
    groups: CpuGroups,
) -> None:
    cpu = min(os.sched_getaffinity(0))
    spinners = [
        subprocess.Popen([sys.executable, "-c", SPIN], start_new_session=True) for _ in range(2)
    ]
    try:
        for spinner in spinners:
            os.sched_setaffinity(spinner.pid, {cpu})
        groups.place("light", 256, [spinners[0].pid])
        groups.place("heavy", 2048, [spinners[1].pid])
        assert groups.pids("light") == {spinners[0].pid}
        assert groups.weight_of("heavy") in (shares(2048), weight(shares(2048)))
        start = [_cpu_seconds(s.pid) for s in spinners]
        deadline = time.monotonic() + 10
        # Until the pair has used a second of CPU between them (about a second of wall time).
        while time.monotonic() < deadline:
            used = [_cpu_seconds(s.pid) - t for s, t in zip(spinners, start, strict=True)]
            if sum(used) >= 1.0:
                break
            time.sleep(0.05)
        light, heavy = used
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    # Weights 1:8; without the groups the two would split the CPU about evenly.
    assert heavy > 3 * light, f"heavy {heavy:.2f} s, light {light:.2f} s of CPU"


def test_a_group_with_a_cpu_limit_gets_no_more_than_it(groups: CpuGroups) -> None:
    spinner = subprocess.Popen([sys.executable, "-c", SPIN], start_new_session=True)
    try:
        os.sched_setaffinity(spinner.pid, {min(os.sched_getaffinity(0))})
        groups.place("limited", 100, [spinner.pid], limit=250)
        assert groups.limit_of("limited") == 250
        start, begun = _cpu_seconds(spinner.pid), time.monotonic()
        time.sleep(1.0)  # the measure is a span of wall time: CPU used over one second
        used = (_cpu_seconds(spinner.pid) - start) / (time.monotonic() - begun)
    finally:
        spinner.kill()
        spinner.wait()
    # A quarter of a CPU per 100 ms period, against a whole CPU without the limit.
    assert used < 0.4, f"a process limited to 250m used {used:.2f} of a CPU"
    groups.place("limited", 100, limit=0)
    assert groups.limit_of("limited") == 0


def test_the_kubelet_puts_each_container_in_its_pods_group_with_the_pods_weight(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    groups: CpuGroups,
    tmp_path: Path,
) -> None:
    api = apiserver.api_client()
    node = Kubelet(api, NODE, tmp_path / "kubelet", abandon_grace=5, cpu=groups)
    node.start()
    try:
        sleeper = {
            "image": "tritonshare",
            "command": ["python", "-c", "import time; time.sleep(60)"],
        }
        create(
            kube_api,
            pod_manifest(
                "weighted",
                {
                    "containers": [
                        {
                            **sleeper,
                            "name": "main",
                            "resources": {"requests": {"cpu": "750m"}, "limits": {"cpu": "1500m"}},
                        },
                        {**sleeper, "name": "side", "resources": {"requests": {"cpu": "250m"}}},
                    ]
                },
            ),
        )
        pod = wait_for(
            "the pod running",
            lambda: (
                (read(kube_api, "weighted") or {}).get("status", {}).get("phase") == "Running"
                and read(kube_api, "weighted")
            ),
        )
        group = f"pod-{pod['metadata']['uid']}"
        wait_for(
            "both containers in their groups",
            lambda: groups.pids(f"{group}/main") and groups.pids(f"{group}/side"),
        )
        assert groups.weight_of(group) in (shares(1000), weight(shares(1000)))
        assert groups.weight_of(f"{group}/main") in (shares(750), weight(shares(750)))
        assert groups.limit_of(f"{group}/main") == 1500
        assert groups.limit_of(f"{group}/side") == 0
    finally:
        node.stop()
        api.close()  # type: ignore[no-untyped-call]
    groups.forget(group)
    assert not (groups.path / group).exists(), "the pod's group outlived its processes"
