"""The node gateway's hold while Triton restores (`gateway.restore`): a held request goes on once
its model is READY again, within its bounds, with a small server standing in for Triton's
readiness endpoint. Through a real Triton and agent: tests/agent/quarantine/test_restore_hold.py."""

from __future__ import annotations

import asyncio
import time
from typing import cast

from aiohttp import web

from common.callers import Caller
from proxy.gateway.restore import Restore
from proxy.gateway.tenants import Tenant
from proxy.policy.limiter import Limiter
from tests.agent.conftest import eventually


def held(pod: Pod) -> bool:
    """Whether the pod's new requests are held now (read afresh: mypy narrows a property)."""
    return pod.limiter.holding


class Pod:
    """What the restore reads of a model pod's tenant: its limiter and its caller row."""

    host = False

    def __init__(self, model_id: str) -> None:
        self.limiter = Limiter(0, 0, 1.0)
        self.caller = Caller(
            "10.0.0.1", model_id, f"team/{model_id}-pod", "uid", triton_name=model_id
        )


async def serve_readiness(answers: dict[str, int]) -> tuple[web.AppRunner, str]:
    async def ready(request: web.Request) -> web.Response:
        return web.Response(status=answers.get(request.match_info["name"], 404))

    app = web.Application()
    app.router.add_get("/v2/models/{name}/ready", ready)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"127.0.0.1:{port}"


async def test_a_held_request_goes_on_once_its_model_is_ready_and_others_stay_held() -> None:
    answers: dict[str, int] = {}
    runner, address = await serve_readiness(answers)
    back, missing = Pod("back"), Pod("missing")
    pods = cast(list[Tenant], [back, missing])
    restore = Restore(address, lambda: pods, hold_seconds=30.0)
    try:
        restore.lost()
        assert held(back) and held(missing)
        assert not back.limiter.try_acquire(), "no slot while its model is restoring"
        first = asyncio.create_task(back.limiter.acquire())
        second = asyncio.create_task(missing.limiter.acquire())
        restore.up()
        await asyncio.sleep(0.3)
        assert not first.done(), "Triton listens, but the model is not READY yet"
        answers["back"] = 200
        await asyncio.wait_for(first, 5)
        assert not held(back) and back.limiter.in_flight == 1
        assert held(missing) and not second.done()
    finally:
        await restore.stop()
        await runner.cleanup()
    await asyncio.wait_for(second, 5)  # a stopping gateway lets every held request go


async def test_a_hold_is_bounded_per_request_and_after_triton_is_back() -> None:
    """A model the agent does not load again: its requests go on after the bound, each on its
    own while Triton is away, and all of them once Triton has been back that long."""
    answers: dict[str, int] = {}
    runner, address = await serve_readiness(answers)
    pod = Pod("never")
    restore = Restore(address, lambda: cast(list[Tenant], [pod]), hold_seconds=0.5)
    try:
        restore.lost()
        started = time.monotonic()
        await asyncio.wait_for(pod.limiter.acquire(), 5)
        assert 0.4 < time.monotonic() - started < 3, "Triton still away: the request's bound"
        assert held(pod), "the model itself is still restoring"
        restore.up()
        await eventually(lambda: not held(pod), limit=5, what="the restore's bound")
        assert pod.limiter.try_acquire(), "no longer held"
    finally:
        await restore.stop()
        await runner.cleanup()


async def test_an_exit_during_a_restore_holds_again_and_no_hold_with_zero() -> None:
    answers: dict[str, int] = {"m": 200}
    runner, address = await serve_readiness(answers)
    pod = Pod("m")
    restore = Restore(address, lambda: cast(list[Tenant], [pod]), hold_seconds=30.0)
    off = Restore(address, lambda: cast(list[Tenant], [pod]), hold_seconds=0.0)
    try:
        restore.lost()
        restore.up()
        await eventually(lambda: not held(pod), limit=5, what="ready: let go")
        restore.lost()
        assert held(pod) and restore.restores == 2
        await restore.stop()
        off.lost()
        assert not held(pod), "--restore-hold-seconds 0 holds nothing"
    finally:
        await restore.stop()
        await runner.cleanup()
