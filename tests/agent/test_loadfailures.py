"""What the agent keeps of a host's loader's failure reports (`agent.loadfailures`): only the
reporting host's own replicas that are not draining, a known reason, one bounded line; each
report replaces the host's last; a bounded number of hosts."""

from __future__ import annotations

from dataclasses import replace

from agent import loadfailures
from agent.loadfailures import LoadFailure, LoadFailures
from agent.placement import Proven
from agent.pods import PodInfo


def replica(model: str, host_uid: str = "host-a", **fields: object) -> Proven:
    pod = PodInfo(
        namespace="team-a",
        name=f"{model}/0",
        uid=f"uid-{model}/0",
        node_name="gpu-1",
        scheduler_name="tritonshare",
        phase="Running",
        model_id=model,
        gpu_uuid="GPU-1",
        host="tritonshare-host-1",
        host_uid=host_uid,
    )
    return Proven(replace(pod, **fields), 1024)  # type: ignore[arg-type]


def test_a_report_counts_only_for_the_hosts_own_replicas_and_replaces_the_last() -> None:
    kept = LoadFailures()
    mine, leaving = replica("mine"), replica("leaving", draining=True)
    other_host = replica("theirs", host_uid="host-b")
    kept.report(
        "host-a",
        [mine, leaving],
        [
            ("mine", 0, "Whatever", "line one\nline two " + "x" * 1000),
            ("leaving", 0, "FetchFailed", "gone"),
            ("theirs", 0, "FetchFailed", "forged"),
        ],
    )
    failure = kept.of(mine.pod)
    assert failure is not None and failure.reason == "ModelLoadFailed"
    assert failure.message.startswith("line one line two x") and len(failure.message) == 400
    assert kept.of(leaving.pod) is None and kept.of(other_host.pod) is None
    # Same replica uid on another host (a copied entry) reads nothing of this host's report.
    assert kept.of(replace(mine.pod, host_uid="host-b")) is None
    kept.report("host-a", [mine], [("mine", 0, "FetchFailed", "HTTP 403")])
    assert kept.of(mine.pod) == LoadFailure("FetchFailed", "HTTP 403")
    kept.report("host-a", [mine], [])
    assert kept.of(mine.pod) is None


def test_the_hosts_remembered_are_bounded() -> None:
    kept = LoadFailures()
    first = replica("m", host_uid="host-0")
    kept.report("host-0", [first], [("m", 0, "FetchFailed", "404")])
    for n in range(1, loadfailures.REMEMBERED_HOSTS + 1):
        kept.report(
            f"host-{n}", [replica("m", host_uid=f"host-{n}")], [("m", 0, "FetchFailed", "x")]
        )
    assert kept.of(first.pod) is None, "forgotten; the host reports again at its next poll"
    assert len(kept._by_host) <= loadfailures.REMEMBERED_HOSTS
