"""The shared /healthz, /readyz and /metrics endpoints, served on a real port."""

from __future__ import annotations

import platform

import aiohttp
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families

from common.health import HttpServer, build_health_app
from common.version import VERSION


async def _get(port: int, path: str) -> tuple[int, str, str]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}{path}") as response,
    ):
        return response.status, response.headers["Content-Type"], await response.text()


async def test_the_endpoints_answer_from_the_part_s_callables() -> None:
    registry = CollectorRegistry()
    Counter("demo_requests_total", "Requests", registry=registry).inc(3)
    reasons = ["Triton is unreachable", "GPUs not read yet"]
    role = ["follower"]
    app = build_health_app(
        registry,
        lambda: list(reasons),
        ready_text=lambda: f"ready ({role[0]})",
        not_ready_status=599,
    )
    server = HttpServer(app, "127.0.0.1", 0)
    await server.start()
    try:
        assert server.port != 0
        assert (await _get(server.port, "/healthz"))[::2] == (200, "ok\n")
        status, _, body = await _get(server.port, "/readyz")
        assert (status, body) == (599, "not ready: Triton is unreachable; GPUs not read yet\n")
        reasons.clear()
        role[0] = "leader"
        assert (await _get(server.port, "/readyz"))[::2] == (200, "ready (leader)\n")
        status, content_type, body = await _get(server.port, "/metrics")
        assert status == 200 and content_type.startswith("text/plain")
        assert "demo_requests_total 3.0" in body
        # Every part's /metrics says which version runs, parseable after the part's own.
        families = {f.name: f for f in text_string_to_metric_families(body)}
        [info] = families["tritonshare_build_info"].samples
        assert info.value == 1.0
        assert info.labels == {
            "version": VERSION,
            "python": platform.python_version(),
        }
    finally:
        await server.stop()


async def test_the_default_ready_text_and_status() -> None:
    reasons: list[str] = ["caches not synced"]
    server = HttpServer(build_health_app(CollectorRegistry(), lambda: reasons), "127.0.0.1", 0)
    await server.start()
    try:
        assert (await _get(server.port, "/readyz"))[::2] == (503, "not ready: caches not synced\n")
        reasons.clear()
        assert (await _get(server.port, "/readyz"))[::2] == (200, "ready\n")
    finally:
        await server.stop()


async def test_stopping_a_server_that_never_started_is_harmless() -> None:
    await HttpServer(build_health_app(CollectorRegistry(), list), "127.0.0.1", 0).stop()


async def test_readiness_may_be_awaited() -> None:
    asked: list[str] = []

    async def not_ready() -> list[str]:
        asked.append("asked")
        return ["model m is not ready in Triton"] if len(asked) == 1 else []

    server = HttpServer(build_health_app(CollectorRegistry(), not_ready), "127.0.0.1", 0)
    await server.start()
    try:
        status, _, body = await _get(server.port, "/readyz")
        assert (status, body) == (503, "not ready: model m is not ready in Triton\n")
        assert (await _get(server.port, "/readyz"))[::2] == (200, "ready\n")
        assert (await _get(server.port, "/nothing"))[0] == 404
    finally:
        await server.stop()


async def test_liveness_fails_with_the_part_s_reasons() -> None:
    reasons: list[str] = []
    app = build_health_app(CollectorRegistry(), list, not_alive=lambda: list(reasons))
    server = HttpServer(app, "127.0.0.1", 0)
    await server.start()
    try:
        assert (await _get(server.port, "/healthz"))[::2] == (200, "ok\n")
        reasons.extend(["the REST listener stopped", "the gRPC listener stopped"])
        status, _, body = await _get(server.port, "/healthz")
        assert (status, body) == (503, "the REST listener stopped; the gRPC listener stopped\n")
        assert (await _get(server.port, "/readyz"))[::2] == (200, "ready\n")
    finally:
        await server.stop()
