"""A tenant turns the proxy's reinstall (proxy/reinstall.py: the loader run again by a Running
pod whose model the node lost) against another team's model, on a fresh agent as after a node pod
replacement (no owner records, nothing installed). The reinstall is the loader through the real
agent with the tenant's own token, so the agent's checks hold: the attacker's proxy is told it
may not act on that model, never runs the loader for it, and a loader run by hand is refused (exit
4); the victim's own reinstall then works, and the victim's pod is told (ModelLoaded)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes.client
import pytest

from proxy.agentclient import AgentClient
from proxy.reinstall import LoaderProcess, LoaderRun, Reinstaller, ReinstallTiming, loader_flags
from sim.apiserver import RunningApiServer
from sim.triton import TritonServer
from tests.agent.conftest import RunningAgent, eventually, make_pod, name_in_triton
from tests.agent.test_attacks import MODEL, attacker_model, infer, namespaces
from tests.conftest import copy_model

pytestmark = pytest.mark.triton


def token_file(tmp: Path, token: str) -> Path:
    path = tmp / "token"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(token)
    return path


def reinstaller(
    address: str, model_dir: Path, model_id: str, token: Path, runs: list[LoaderRun]
) -> tuple[Reinstaller, LoaderProcess]:
    loader = LoaderProcess(
        loader_flags(model_dir, model_id, address, token, log_level="INFO", log_format="text")
    )

    async def run() -> LoaderRun:
        outcome = await loader.run()
        runs.append(outcome)
        return outcome

    async def never_ready() -> bool:
        return False

    watcher = Reinstaller(
        model_id,
        AgentClient(address, token, 10.0),
        never_ready,
        run,
        ReinstallTiming(check_seconds=0.5, backoff_max_seconds=5.0),
    )
    return watcher, loader


async def test_a_pod_cannot_have_another_teams_lost_model_reinstalled(
    running: RunningAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    triton: TritonServer,
    tmp_path: Path,
) -> None:
    namespaces(kube_api, "team-a", "team-b")
    gpu = running.mock.gpus[0].uuid
    make_pod(kube_api, "victim", MODEL, namespace="team-b", gpu_uuid=gpu, phase="Running")
    make_pod(kube_api, "attacker", "mine", namespace="team-a", gpu_uuid=gpu, phase="Running")
    address = running.agent.grpc_address
    attacker_token = token_file(tmp_path / "a", apiserver.mint_token("team-a", "attacker"))
    source = attacker_model(tmp_path)

    # The attacker's proxy, told (by its own flags) that the victim's model is its own.
    runs: list[LoaderRun] = []
    watcher, _ = reinstaller(address, source, MODEL, attacker_token, runs)
    channel = AgentClient(address, attacker_token, 10.0).channel()
    async with channel:
        for _ in range(3):
            await watcher.check_once(channel)
    assert runs == [], "the agent refuses the attacker: nothing to reinstall"
    assert "refuses this pod" in watcher.reason and "may act only on that model" in watcher.reason

    # The loader run by hand with the attacker's token: refused, a permanent exit.
    outcome = await LoaderProcess(
        loader_flags(source, MODEL, address, attacker_token, log_level="INFO", log_format="text")
    ).run()
    assert outcome.exit_code == 4, outcome
    assert not any(running.agent.repository.root.glob(f"{MODEL}*"))

    # The victim's own proxy reinstalls it, on the GPU of its proof.
    victim_token = token_file(tmp_path / "v", apiserver.mint_token("team-b", "victim"))
    victim_source = copy_model("add_one", tmp_path / "victim", as_name=MODEL)
    runs = []
    watcher, _ = reinstaller(address, victim_source, MODEL, victim_token, runs)
    async with AgentClient(address, victim_token, 10.0).channel() as channel:
        await watcher.check_once(channel)
    assert [r.exit_code for r in runs] == [0], runs
    assert gpu in runs[0].message
    print(f"\nthe reinstalling loader's peak memory: {runs[0].peak_bytes / 2**20:.0f} MiB")
    assert infer(triton, name_in_triton(kube_api, "victim", MODEL, "team-b")) == 2.0

    core: Any = kubernetes.client.CoreV1Api(kube_api)

    def victim_told() -> bool:
        pod = core.read_namespaced_pod("victim", "team-b")
        return any(
            c.type == "tritonshare.io/ModelLoaded" and c.status == "True"
            for c in pod.status.conditions or []
        )

    await eventually(victim_told, what="ModelLoaded=True on the victim's pod")
