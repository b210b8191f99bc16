"""CPU the agent spends on its calls to the API server: through the product's one door to it
(common.kubeapi, the agent's adapter agent.kube.client) beside the official `kubernetes` client
the agent's adapter used before, making the same requests the same way.

Starts `python -m sim.apiserver` as its own process, so the CPU measured is the agent's side
alone, creates one pod, then in each round makes --calls calls of each kind through each client
as the agent makes them (awaited one after another, each on a thread pool of 4): read the pod,
and set a condition on its status (a strategic-merge patch). Prints, per kind, the CPU of this
process and the wall time per call, the median of --rounds rounds, the two clients taking turns.
The goal (checked unless `--no-goal`): for each kind, the one door spends no more CPU a call
than the official client.

Run: .venv/bin/python -m benchmarks.agent_kube [--calls 500 --rounds 5] [--no-goal]
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import kubernetes.client

from agent.kube.client import REQUEST_TIMEOUT, KubeClient
from benchmarks import apiserver_process, command_line, goals
from common.conditions import Condition, condition_patch

NAMESPACE = "default"
POD = "bench-pod"
CONDITION = "tritonshare.io/bench"


class OfficialClient:
    """The requests the agent's adapter made through the official client: the generated API
    class, `_preload_content=False` and the body read as JSON, on a thread pool of 4."""

    def __init__(self, url: str) -> None:
        configuration = kubernetes.client.Configuration()
        configuration.host = url
        self.api = kubernetes.client.ApiClient(configuration)
        self.core: Any = kubernetes.client.CoreV1Api(self.api)
        self.executor = ThreadPoolExecutor(max_workers=4)

    async def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        def run() -> Any:
            kwargs.setdefault("_request_timeout", REQUEST_TIMEOUT)
            response = fn(*args, _preload_content=False, **kwargs)
            try:
                return json.loads(response.data) if response.data else None
            finally:
                response.release_conn()

        return await asyncio.get_running_loop().run_in_executor(self.executor, run)

    async def get_pod(self, namespace: str, name: str) -> Any:
        return await self._call(self.core.read_namespaced_pod, name, namespace)

    async def set_pod_condition(self, namespace: str, name: str, condition: Condition) -> None:
        body = {"status": {"conditions": [condition_patch(condition, None)]}}
        await self._call(
            self.core.patch_namespaced_pod_status,
            name,
            namespace,
            body,
            _content_type="application/strategic-merge-patch+json",
        )

    def close(self) -> None:
        self.executor.shutdown()
        self.api.close()  # type: ignore[no-untyped-call]


def _kubeconfig(url: str, folder: Path) -> str:
    path = folder / "kubeconfig"
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "sim", "cluster": {"server": url}}],
                "users": [{"name": "agent", "user": {}}],
                "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "agent"}}],
                "current-context": "sim",
            }
        )
    )
    return str(path)


async def _timed(calls: int, call: Callable[[int], Awaitable[Any]]) -> tuple[float, float]:
    """CPU of this process and wall time per call, in ms, over `calls` calls."""
    cpu, wall = time.process_time(), time.perf_counter()
    for i in range(calls):
        await call(i)
    return (
        (time.process_time() - cpu) * 1000 / calls,
        (time.perf_counter() - wall) * 1000 / calls,
    )


CPU = dict[str, dict[str, float]]
"""Per kind of call, each client's median CPU a call in milliseconds."""


def check_goals(cpu: CPU) -> list[bool]:
    """For each kind of call, the one door's CPU a call at most the official client's."""
    return [
        goals.check(
            f"{kind}: the one door's CPU a call / the official client's",
            by_client["one door"] / by_client["official client"],
            1.0,
            unit="x",
        )
        for kind, by_client in cpu.items()
    ]


async def _run(url: str, kubeconfig: str, calls: int, rounds: int) -> CPU:
    official = OfficialClient(url)
    door = KubeClient(kubeconfig)
    try:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": POD, "namespace": NAMESPACE},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        }
        await asyncio.get_running_loop().run_in_executor(
            None, lambda: official.core.create_namespaced_pod(NAMESPACE, pod)
        )
        clients: dict[str, Any] = {"official client": official, "one door": door}
        kinds: dict[str, Callable[[Any], Callable[[int], Awaitable[Any]]]] = {
            "read a pod": lambda c: lambda i: c.get_pod(NAMESPACE, POD),
            "set a pod condition": lambda c: (
                lambda i: c.set_pod_condition(
                    NAMESPACE, POD, Condition(CONDITION, "True" if i % 2 else "False", "Bench", "")
                )
            ),
        }
        medians: CPU = {}
        for kind, make in kinds.items():
            for client in clients.values():  # warm: connections open, code paths loaded
                await _timed(20, make(client))
            figures: dict[str, list[tuple[float, float]]] = {name: [] for name in clients}
            for _ in range(rounds):
                for name, client in clients.items():
                    figures[name].append(await _timed(calls, make(client)))
            cpu = {n: statistics.median(f[0] for f in figs) for n, figs in figures.items()}
            wall = {n: statistics.median(f[1] for f in figs) for n, figs in figures.items()}
            for name in clients:
                print(
                    f"{kind:<20} {name:<16} {cpu[name]:6.3f} ms CPU a call  "
                    f"{wall[name]:6.3f} ms wall a call"
                )
            ratio = cpu["official client"] / cpu["one door"]
            print(f"{kind:<20} the one door spends {ratio:.1f}x less CPU a call")
            medians[kind] = cpu
        return medians
    finally:
        official.close()
        await door.close()


def main() -> int:
    parser = command_line(
        "agent_kube",
        (
            "Measures the agent's CPU and wall time per call to the API server through its "
            "adapter (the product's one door) beside the official kubernetes client, on a "
            "simulated API server in its own process: --calls calls per round, --rounds rounds."
        ),
    )
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    goals.add_flag(parser)
    args = parser.parse_args()
    with apiserver_process() as (url, _), tempfile.TemporaryDirectory() as folder:
        print(f"simulated API server at {url}; {args.calls} calls a round, {args.rounds} rounds")
        cpu = asyncio.run(_run(url, _kubeconfig(url, Path(folder)), args.calls, args.rounds))
    return goals.exit_code(check_goals(cpu), args.no_goal)


if __name__ == "__main__":
    sys.exit(main())
