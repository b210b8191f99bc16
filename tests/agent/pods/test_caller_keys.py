"""Caller keys from the agent's side: each pod's token gets that pod's own key, the caller table
holds only digests, and a key outlives an agent restart but not its pod.

The attacks: a tenant asks for a key with its own token (it gets its own pod's, which names only
its own rows), reads the table (it cannot: the node pod's volume; and it holds no key anyway),
replays a deleted pod's key (a new pod of the same name has another uid, so another key), or
asks with no token (refused).
"""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import grpc
import kubernetes.client
import pytest

from agent.pods.callerkeys import SECRET_FILE
from agent.pods.callertable import callers_of
from common.callerkeys import digest
from protos import agent_pb2
from sim.apiserver import RunningApiServer
from tests.agent.conftest import RunningAgent, StartAgent, bearer, eventually, install_dir, make_pod
from tests.agent.pods.test_gateway_table import pod, replica, set_address, table_of
from tests.conftest import copy_model

pytestmark = pytest.mark.triton


def test_every_row_of_a_host_carries_the_hosts_key_and_a_pod_its_own() -> None:
    owners = {
        "a-private": pod("a", "10.1.0.5"),
        "m1-private": replica("m1", "host-1", "10.1.0.7"),
        "m2-private": replica("m2", "host-1", "10.1.0.7", ordinal=1),
    }
    callers, _ = callers_of(owners, lambda uid: digest(uid.encode().ljust(32, b"-")))
    keys = {(c.address, c.model_id): c.key for c in callers}
    assert keys[("10.1.0.5", "a")] == digest(b"uid-a".ljust(32, b"-"))
    assert (
        keys[("10.1.0.7", "m1")]
        == keys[("10.1.0.7", "m2")]
        == digest(b"uid-host-1".ljust(32, b"-"))
    )


async def _key(running: RunningAgent, token: str) -> bytes:
    reply = await running.stub.CallerKey(agent_pb2.CallerKeyRequest(), metadata=bearer(token))
    assert len(reply.key) == 32
    return bytes(reply.key)


async def test_a_pod_gets_its_own_key_and_the_table_only_its_digest(
    start_custom_agent: StartAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    tmp_path: Path,
) -> None:
    table = tmp_path / "gateway" / "callers.json"
    running = await start_custom_agent(gateway_table=table, gateway_table_refresh_seconds=0.2)
    secret = table.with_name(SECRET_FILE)
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    gpu = running.mock.gpus[0].uuid
    make_pod(kube_api, "owner", "add_one", gpu_uuid=gpu)
    set_address(kube_api, "owner", "127.1.0.5")
    make_pod(kube_api, "neighbour", "other", gpu_uuid=gpu)
    owner_token = apiserver.mint_token("default", "owner")
    await install_dir(running.stub, owner_token, copy_model("add_one", tmp_path / "m"), "add_one")
    await eventually(
        lambda: (t := table_of(table)) is not None and len(t.callers) == 1,
        what="the owner in the table",
    )
    key = await _key(running, owner_token)
    reply = await running.stub.CallerKey(agent_pb2.CallerKeyRequest(), metadata=bearer(owner_token))
    assert reply.pod == "default/owner"
    written = table_of(table)
    assert written is not None and written.callers[0].key == digest(key)
    assert key.hex().encode() not in table.read_bytes() and key not in table.read_bytes()
    # Another pod's token gets that pod's key, which names no row of the owner's.
    neighbour = await _key(running, apiserver.mint_token("default", "neighbour"))
    assert neighbour != key
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await running.stub.CallerKey(agent_pb2.CallerKeyRequest())
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED

    # An agent restarted on the same volume gives the same key.
    await running.stop()
    again = await start_custom_agent(gateway_table=table, gateway_table_refresh_seconds=0.2)
    assert await _key(again, apiserver.mint_token("default", "owner")) == key

    # The pod is replaced by one of the same name: a new uid, a new key; the old one names no one.
    core: Any = kubernetes.client.CoreV1Api(kube_api)
    core.delete_namespaced_pod("owner", "default", grace_period_seconds=0)
    make_pod(kube_api, "owner", "add_one", gpu_uuid=gpu)
    assert await _key(again, apiserver.mint_token("default", "owner")) != key


async def test_without_a_gateway_there_is_no_key(
    start_custom_agent: StartAgent, apiserver: RunningApiServer, kube_api: Any
) -> None:
    running = await start_custom_agent()
    make_pod(kube_api, "owner", "add_one", gpu_uuid=running.mock.gpus[0].uuid)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _key(running, apiserver.mint_token("default", "owner"))
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "--gateway-table" in (caught.value.details() or "")
