"""A tenant rewrites its own model host's hosted-models annotation as fast as the API server
takes it, with entries by the hundred, to keep the agent busy: the real agent against sim/'s API
server through the official client. The agent checks each entry's proof once while it is
unchanged, refuses a host naming more replicas than the node can hold of one namespace (an Event
on the host says why), and answers /healthz off its loop, so a busy loop cannot make the node
look dead."""

from __future__ import annotations

import threading
import urllib.request
from dataclasses import replace
from typing import Any

import kubernetes.client

from common.hosted import HostedReplica, host_name
from common.proofs import Claim, KeyRing, Proof
from protos import agent_pb2
from sim.apiserver import RunningApiServer
from tests.agent.conftest import NODE, RunningAgent, bearer, eventually
from tests.agent.hosts import make_host, replica, set_hosted
from tests.fixtures_sim import core_v1

GPU = "GPU-00000000-0000-0000-0000-000000000001"


def _namespaces(api: kubernetes.client.ApiClient) -> None:
    for name in ("team-a", "team-b"):
        core_v1(api).create_namespace({"metadata": {"name": name}})


def _host_events(api: kubernetes.client.ApiClient, namespace: str) -> dict[str, str]:
    found = core_v1(api).list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={host_name(NODE)}"
    )
    return {e.reason: e.message for e in found.items}


def _replicas_seen(running: RunningAgent, namespace: str) -> int:
    pods = running.agent.pods.by_key.values()
    return sum(1 for p in pods if p.host and p.namespace == namespace)


async def test_an_unchanged_entry_is_proved_once_however_often_its_host_is_rewritten(
    kube_api: kubernetes.client.ApiClient, running: RunningAgent, monkeypatch: Any
) -> None:
    checks = []
    verify = KeyRing.verify

    def counted(ring: KeyRing, claim: Claim, value: str) -> Proof:
        checks.append(claim.name)
        return verify(ring, claim, value)

    monkeypatch.setattr(KeyRing, "verify", counted)
    _namespaces(kube_api)
    forged = [replace(replica("team-a", f"m{i}", GPU), proof="v1.forged") for i in range(100)]
    real = replica("team-a", "resnet", GPU)
    entries: list[HostedReplica] = [real, *forged]
    make_host(kube_api, "team-a", entries)
    await eventually(lambda: _replicas_seen(running, "team-a") == len(entries), what="the host")
    # Rewritten 30 times, the same entries each time and one more at the end: each pass of the
    # agent proves every entry it acts for, but a proof it has checked is not checked again.
    for _ in range(30):
        set_hosted(kube_api, "team-a", entries)
    extra = replica("team-a", "bert", GPU)
    set_hosted(kube_api, "team-a", [*entries, extra])
    await eventually(
        lambda: _replicas_seen(running, "team-a") == len(entries) + 1, what="the last rewrite"
    )
    seen = running.agent.reconciler.passes
    await eventually(lambda: running.agent.reconciler.passes >= seen + 2, what="two more passes")
    assert len(checks) <= len(entries) + 1, f"{len(checks)} checks of {len(entries) + 1} entries"
    assert {p.key for p in running.agent.pods.all_proven()} == {
        "team-a/resnet/0",
        "team-a/bert/0",
    }


async def test_a_host_naming_more_replicas_than_the_node_holds_serves_none_and_says_why(
    apiserver: RunningApiServer, kube_api: kubernetes.client.ApiClient, running: RunningAgent
) -> None:
    _namespaces(kube_api)
    # 2 T4s of 15Gi: at the least a model may ask (64Mi), 480 replicas of one namespace.
    forged = [replace(replica("team-a", f"m{i}", GPU), proof="v1.forged") for i in range(480)]
    entries = [replica("team-a", "resnet", GPU), *forged]
    make_host(kube_api, "team-a", entries)
    await eventually(
        lambda: "HostedModelsInvalid" in _host_events(kube_api, "team-a"),
        what="the host's Event",
    )
    message = _host_events(kube_api, "team-a")["HostedModelsInvalid"]
    assert "names 481 replicas, more than this node can hold of one namespace (480" in message
    assert "--min-gpu-mem" in message
    assert _replicas_seen(running, "team-a") == 0
    # Its own calls get the same answer: it lists nothing.
    token = apiserver.mint_token("team-a", host_name(NODE))
    listed = await running.stub.ListHosted(agent_pb2.ListHostedRequest(), metadata=bearer(token))
    assert not listed.replicas
    assert [why for why in listed.refused if "names 481 replicas" in why] == [message]
    # Its forged entries cost no Event each: only the refusal of the whole.
    assert "PlacementChanged" not in _host_events(kube_api, "team-a")
    # The neighbour's host on the node is served as before.
    make_host(kube_api, "team-b", [replica("team-b", "bert", GPU)])
    await eventually(lambda: _replicas_seen(running, "team-b") == 1, what="the neighbour's host")
    assert [p.key for p in running.agent.pods.all_proven()] == ["team-b/bert/0"]


async def test_healthz_answers_while_the_agents_loop_is_busy(running: RunningAgent) -> None:
    """The agent's loop is held (as a flood of pod events holds it) until /healthz has answered
    from another thread: an answer at all proves it is served off the loop."""
    url = f"http://{running.agent.http_address}/healthz"
    answers: list[int] = []
    answered = threading.Event()

    def probe() -> None:
        try:
            with urllib.request.urlopen(url, timeout=20) as answer:
                answers.append(int(answer.status))
        except OSError:
            pass
        answered.set()

    thread = threading.Thread(target=probe)
    thread.start()
    try:
        held = answered.wait(15)  # on the agent's loop: nothing else runs there meanwhile
    finally:
        thread.join()
    assert held, "/healthz did not answer while the agent's loop was busy"
    assert answers == [200]
