"""The documented bound on Triton's exits per namespace, through a real Triton and a real agent:
whatever the order of a namespace's crashing loads, the node's Triton goes down at most
`--crash-quarantine-after` times for one version of the files and
`--crash-quarantine-after` + `--crash-namespace-quarantine-after` times for the namespace in all,
and the namespace is quarantined only then: each exit counts once, however many of its versions
were loading at it.

Before: five crashers (one byte apart) whose loaders ask at once took Triton down 9 to 12 times
(a load that died, never READY, was reloaded as "what Triton held"; an exit beside a neighbour's
requests counted against nobody), and a second version after the first bought one exit more.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import kubernetes.client
import pytest

from agent.quarantine.crashledger import Marker
from protos import agent_pb2
from sim.apiserver import RunningApiServer
from sim.crashers import load_killer
from sim.triton import TritonServer
from tests.agent.conftest import (
    RunningAgent,
    StartAgent,
    bearer,
    eventually,
    install_dir,
    make_pod,
    name_in_triton,
)
from tests.agent.quarantine.test_quarantine import kubelet_restarts
from tests.conftest import copy_model

pytestmark = [pytest.mark.triton, pytest.mark.slow]

FILES_AFTER = 3
NAMESPACE_AFTER = 2


async def crasher(
    running: RunningAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    source: Path,
    version: int,
) -> str:
    """Pod `killer-<version>`, Running, whose loader installed the killer with `version` bytes
    more (a new digest each); returns its token."""
    model = copy_model("add_one", source / str(version), as_name=f"killer-{version}")
    (model / "1" / "model.py").write_text(load_killer() + "#" * version)
    gpu = running.mock.gpus[0].uuid
    make_pod(kube_api, f"killer-{version}", f"killer-{version}", gpu_uuid=gpu, phase="Running")
    token = apiserver.mint_token("default", f"killer-{version}")
    await install_dir(running.stub, token, model, f"killer-{version}")
    return token


@contextlib.asynccontextmanager
async def loaders(running: RunningAgent, tokens: dict[int, str]) -> AsyncIterator[None]:
    """Each pod's loader asking for its load again and again, as a loader that was not answered
    READY does, until the node refuses it for good (FAILED_PRECONDITION: quarantined)."""

    async def ask(version: int, token: str) -> None:
        while True:
            try:
                await running.stub.LoadModel(
                    agent_pb2.LoadModelRequest(model_id=f"killer-{version}"),
                    metadata=bearer(token),
                )
            except grpc.aio.AioRpcError as e:
                if e.code() == grpc.StatusCode.FAILED_PRECONDITION:
                    return
            await asyncio.sleep(0.2)  # a loader's retry interval

    tasks = [asyncio.create_task(ask(v, t)) for v, t in tokens.items()]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def quiet(running: RunningAgent, restarts: list[int], passes: int = 4) -> None:
    """Wait until the reconciler made `passes` passes with no exit of Triton meanwhile."""
    while True:
        seen, start = len(restarts), running.agent.reconciler.passes
        await eventually(
            lambda s=seen, p=start: (
                running.agent.reconciler.passes >= p + passes or len(restarts) > s
            ),
            limit=60,
            what="reconcile passes",
        )
        if len(restarts) == seen:
            return


async def test_five_crashers_of_a_namespace_asking_at_once_take_triton_down_at_most_the_bound(
    start_custom_agent: StartAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    triton: TritonServer,
    tmp_path: Path,
) -> None:
    running = await start_custom_agent(
        crash_quarantine_after=FILES_AFTER,
        crash_namespace_quarantine_after=NAMESPACE_AFTER,
        lease_renew_seconds=0.5,
    )
    tokens = {v: await crasher(running, apiserver, kube_api, tmp_path, v) for v in range(5)}
    async with kubelet_restarts(triton) as restarts, loaders(running, tokens):
        await eventually(
            lambda: running.agent.crashes.namespace_quarantine("default") is not None,
            limit=240,
            what="the namespace quarantined",
        )
        await quiet(running, restarts)
    # Each exit counted once, however many versions were loading at it: the bound, exactly.
    assert len(restarts) == FILES_AFTER + NAMESPACE_AFTER, len(restarts)
    counts = [r.crashes for r in running.agent.crashes.records()]
    assert max(counts) <= FILES_AFTER, counts


async def test_a_second_version_after_the_first_is_quarantined_buys_the_namespace_bound_only(
    start_custom_agent: StartAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    triton: TritonServer,
    tmp_path: Path,
) -> None:
    running = await start_custom_agent(
        crash_quarantine_after=FILES_AFTER,
        crash_namespace_quarantine_after=NAMESPACE_AFTER,
        lease_renew_seconds=0.5,
    )
    async with kubelet_restarts(triton) as restarts:
        first = {0: await crasher(running, apiserver, kube_api, tmp_path, 0)}
        async with loaders(running, first):
            await eventually(
                lambda: any(r.quarantined for r in running.agent.crashes.records()),
                limit=120,
                what="the first version quarantined",
            )
            await quiet(running, restarts)
        assert len(restarts) == FILES_AFTER
        second = {1: await crasher(running, apiserver, kube_api, tmp_path, 1)}
        async with loaders(running, second):
            await eventually(
                lambda: running.agent.crashes.namespace_quarantine("default") is not None,
                limit=120,
                what="the namespace quarantined",
            )
            await quiet(running, restarts)
    assert len(restarts) == FILES_AFTER + NAMESPACE_AFTER


async def test_versions_in_flight_at_one_exit_asked_for_again_at_once_count_it_once(
    start_custom_agent: StartAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Three versions of a namespace's crasher were in flight together when Triton died (their
    markers left as such loads leave them, naming the Triton they were sent to), and each pod's
    loader asks again before any pass: each version's files count the exit, the namespace once."""
    running = await start_custom_agent(
        crash_quarantine_after=FILES_AFTER,
        crash_namespace_quarantine_after=NAMESPACE_AFTER,
        resync_seconds=3600,
        crash_settle_seconds=0.0,  # READY at once: the records of the files end, not the
        crash_hold_seconds=0.0,  # namespace's count, which a good load never resets
    )
    caplog.set_level(logging.WARNING)
    crashes = running.agent.crashes
    tokens = {}
    for version in range(3):
        # Each version loads fine now: only the markers tell of the exit.
        model = copy_model("add_one", tmp_path / str(version), as_name=f"v-{version}")
        (model / "1" / "model.py").write_text(
            (model / "1" / "model.py").read_text() + "#" * version
        )
        gpu = running.mock.gpus[0].uuid
        make_pod(kube_api, f"v-{version}", f"v-{version}", gpu_uuid=gpu)  # loaders: Pending
        tokens[version] = apiserver.mint_token("default", f"v-{version}")
        await install_dir(running.stub, tokens[version], model, f"v-{version}")
    while True:  # no pass under way: the loaders ask before any pass finds the markers
        seen = running.agent.reconciler.passes
        await asyncio.sleep(0.5)
        if running.agent.reconciler.passes == seen:
            break
    for version in tokens:
        name = name_in_triton(kube_api, f"v-{version}", f"v-{version}")
        owned = running.agent.owners.get(name)
        assert owned is not None
        pod = f"default/v-{version}"
        marker = Marker(name, owned.digest, f"v-{version}", pod, triton=crashes.triton)
        crashes.loading(marker)
    await asyncio.gather(
        *(
            running.stub.LoadModel(
                agent_pb2.LoadModelRequest(model_id=f"v-{v}"), metadata=bearer(token)
            )
            for v, token in tokens.items()
        )
    )
    # As it loads again, or by a pass that found its marker first.
    found = [r for r in caplog.records if "Triton exited while loading" in r.getMessage()]
    assert len(found) == 3, "each version's files counted the exit"
    assert [n.crashes for n in crashes.namespaces()] == [1], "the namespace counted it once"
