"""What the agent keeps of a host's loader's failure reports (`agent.pods.loadfailures`): only the
reporting host's own replicas that are not draining, found by the model id and ordinal the loader
names them by (spec.modelName, where the TritonModel has one), a known reason, one bounded line;
each report replaces the host's last and says whether it changed; a bounded number of hosts."""

from __future__ import annotations

from dataclasses import replace

from agent.pods import loadfailures
from agent.pods.loadfailures import LoadFailure, LoadFailures
from agent.pods.modelpods import PodInfo
from agent.pods.provenpods import Proven
from common.hosted import HostedReplica

Hosted = tuple[HostedReplica, Proven]


def replica(model: str, host_uid: str = "host-a", model_id: str = "", **fields: object) -> Hosted:
    """Replica 0 of TritonModel `model` (served as `model_id`, its spec.modelName, when given)
    on the host of uid `host_uid`, beside its entry in the host's annotation."""
    entry = HostedReplica(model, f"uid-{model}", 0, "GPU-1", "always", "proof", model_id=model_id)
    pod = PodInfo(
        namespace="team-a",
        name=entry.replica_name,
        uid=entry.replica_uid,
        node_name="gpu-1",
        scheduler_name="tritonshare",
        phase="Running",
        model_id=entry.model_id,
        gpu_uuid="GPU-1",
        host="tritonshare-host-1",
        host_uid=host_uid,
    )
    return entry, Proven(replace(pod, **fields), 1024)  # type: ignore[arg-type]


def test_a_report_counts_only_for_the_hosts_own_replicas_and_replaces_the_last() -> None:
    kept = LoadFailures()
    mine, leaving = replica("mine"), replica("leaving", draining=True)
    other_host = replica("theirs", host_uid="host-b")
    assert kept.report(
        "host-a",
        [mine, leaving],
        [
            ("mine", 0, "Whatever", "line one\nline two " + "x" * 1000),
            ("leaving", 0, "FetchFailed", "gone"),
            ("theirs", 0, "FetchFailed", "forged"),
        ],
    )
    failure = kept.of(mine[1].pod)
    assert failure is not None and failure.reason == "ModelLoadFailed"
    assert failure.message.startswith("line one line two x") and len(failure.message) == 400
    assert kept.of(leaving[1].pod) is None and kept.of(other_host[1].pod) is None
    # Same replica uid on another host (a copied entry) reads nothing of this host's report.
    assert kept.of(replace(mine[1].pod, host_uid="host-b")) is None
    assert kept.report("host-a", [mine], [("mine", 0, "FetchFailed", "HTTP 403")])
    assert kept.of(mine[1].pod) == LoadFailure("FetchFailed", "HTTP 403")
    assert not kept.report("host-a", [mine], [("mine", 0, "FetchFailed", "HTTP 403")])
    assert kept.report("host-a", [mine], [])
    assert kept.of(mine[1].pod) is None
    assert not kept.report("host-a", [mine], [])


def test_a_replica_served_under_its_model_name_is_found_by_that_name() -> None:
    """The loader names a replica by the model id its clients send (spec.modelName), which
    need not be the TritonModel's name; the TritonModel's name finds nothing."""
    kept = LoadFailures()
    renamed = replica("wrongname", model_id="other_name")
    said = "config.pbtxt names the model 'add_one' but the model id is 'other_name'"
    assert kept.report("host-a", [renamed], [("other_name", 0, "ModelInvalid", said)])
    assert kept.of(renamed[1].pod) == LoadFailure("ModelInvalid", said)
    assert kept.report("host-a", [renamed], [("wrongname", 0, "ModelInvalid", said)])
    assert kept.of(renamed[1].pod) is None
    # Another ordinal of the same model is another replica.
    assert not kept.report("host-a", [renamed], [("other_name", 1, "ModelInvalid", said)])
    assert kept.of(renamed[1].pod) is None


def test_the_hosts_remembered_are_bounded() -> None:
    kept = LoadFailures()
    first = replica("m", host_uid="host-0")
    kept.report("host-0", [first], [("m", 0, "FetchFailed", "404")])
    for n in range(1, loadfailures.REMEMBERED_HOSTS + 1):
        kept.report(
            f"host-{n}", [replica("m", host_uid=f"host-{n}")], [("m", 0, "FetchFailed", "x")]
        )
    assert kept.of(first[1].pod) is None, "forgotten; the host reports again at its next poll"
    assert len(kept._by_host) <= loadfailures.REMEMBERED_HOSTS
