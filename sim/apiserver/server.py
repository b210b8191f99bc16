"""Running the API server: in a background thread for tests, or as the main loop of a process.

`start_in_thread()` gives a `RunningApiServer` handle (URL, kubeconfig, an official-client
`ApiClient`, token minting, the audit log, the clock, armed faults) whose `stop()` ends every
watch and joins the thread; `pause()` and `resume()` take it down (connection refused) and bring
it back on the same port with its objects, as an outage of a real API server over etcd does.
`serve()` runs the same server until a stop event, for `python -m sim.apiserver`.
Both create the namespaces every cluster starts with. Request semantics live in `routes`/`rest`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import yaml
from aiohttp import web

from common.contract import DEFAULT_SYSTEM_NAMESPACE
from sim.apiserver.audit import AuditLog
from sim.apiserver.clock import Clock
from sim.apiserver.errors import ApiError
from sim.apiserver.faults import Faults
from sim.apiserver.priority import built_in_classes
from sim.apiserver.resources import CUSTOM_RESOURCE_DEFINITIONS, NAMESPACES, PODS, PRIORITY_CLASSES
from sim.apiserver.routes import ApiServerCore, build_app
from sim.apiserver.settings import ApiServerSettings

if TYPE_CHECKING:
    import kubernetes.client

log = logging.getLogger(__name__)

INITIAL_NAMESPACES = ("default", "kube-system", "kube-public", DEFAULT_SYSTEM_NAMESPACE)
SHUTDOWN_TIMEOUT_SECONDS = 2.0
T = TypeVar("T")


def _create_initial_namespaces(core: ApiServerCore) -> None:
    """The namespaces, and the built-in PriorityClasses, a new cluster has; then the CRDs of
    `settings.crds`."""
    for name in INITIAL_NAMESPACES:
        core.registry.create(NAMESPACES, "", {"metadata": {"name": name}})
    for priority_class in built_in_classes():
        core.registry.create(PRIORITY_CLASSES, "", priority_class)
    for crd in crd_manifests(core.settings.crds):
        try:
            core.registry.create(CUSTOM_RESOURCE_DEFINITIONS, "", crd)
        except ApiError as e:
            raise ValueError(f"the CRD manifests given are refused: {e.message}") from e


def crd_manifests(paths: tuple[Path, ...]) -> list[dict[str, Any]]:
    """The CustomResourceDefinitions in these files (or folders' `.yaml` files), in order; a
    missing file or another kind in one is a ValueError that names it."""
    found: list[dict[str, Any]] = []
    for given in paths:
        files = sorted(given.glob("*.yaml")) if given.is_dir() else [given]
        for file in files:
            try:
                documents = [d for d in yaml.safe_load_all(file.read_text()) if d]
            except (OSError, yaml.YAMLError) as e:
                raise ValueError(f"cannot read the CRD manifest {file}: {e}") from e
            for document in documents:
                if document.get("kind") != CUSTOM_RESOURCE_DEFINITIONS.kind:
                    raise ValueError(
                        f"{file} holds a {document.get('kind')}, not a CustomResourceDefinition:"
                        " pass only CRD manifests to --crds"
                    )
                found.append(document)
    return found


def kubeconfig_document(url: str, token: str | None = None) -> dict[str, Any]:
    """A kubeconfig for `url`; with `token`, requests carry it and are made as its service
    account (admission and the audit log see that user); without, as the cluster admin."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "sim", "cluster": {"server": url}}],
        "users": [{"name": "sim", "user": {"token": token} if token else {}}],
        "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "sim"}}],
        "current-context": "sim",
        "preferences": {},
    }


def write_kubeconfig(url: str, path: Path, token: str | None = None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(kubeconfig_document(url, token), sort_keys=False))
    return path


POD_GC_SECONDS = 0.2
"""How often gracefully deleted pods that no kubelet will finish are looked at."""


async def _pod_gc(core: ApiServerCore, _: web.Application) -> AsyncIterator[None]:
    """Finish the deletions no kubelet will (`Registry.finish_overdue_deletions`), while the
    server serves."""

    async def sweep() -> None:
        while True:
            await asyncio.sleep(POD_GC_SECONDS)
            core.registry.finish_overdue_deletions()

    task = asyncio.create_task(sweep(), name="sim-apiserver pod gc")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _start_site(core: ApiServerCore, host: str, port: int) -> tuple[web.AppRunner, int]:
    app = build_app(core)

    async def end_watches(_: web.Application) -> None:
        core.store.close()

    app.on_shutdown.append(end_watches)
    app.cleanup_ctx.append(partial(_pod_gc, core))
    runner = web.AppRunner(
        app, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT_SECONDS, handle_signals=False
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True)
    await site.start()
    bound = int(runner.addresses[0][1])
    return runner, bound


_SETUP_TURNS = 10
"""Turns of the event loop an accepted connection's setup takes, with room to spare (three)."""


class RunningApiServer:
    """A simulated API server serving on its own thread and event loop."""

    def __init__(self, core: ApiServerCore, host: str) -> None:
        self._core = core
        self._host = host
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._runner: web.AppRunner | None = None
        self._startup_error: BaseException | None = None
        self.port = 0
        self._requested_port = 0
        self._thread = threading.Thread(target=self._run, name="sim-apiserver", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self.port}"

    @property
    def audit(self) -> AuditLog:
        return self._core.audit

    @property
    def clock(self) -> Clock:
        return self._core.clock

    @property
    def resource_version(self) -> int:
        return self._core.store.rv

    @property
    def faults(self) -> Faults:
        """Arm `Fault`s here to answer chosen requests with 429, 500 or 503."""
        return self._core.faults

    def slow(self, seconds: float) -> None:
        """Answer every resource request `seconds` late from now on (a watch starts that late;
        its events then flow at once), as an overloaded API server or a slow etcd does; 0 to
        answer at once again (the default)."""
        if seconds < 0:
            raise ValueError(f"a delay of {seconds} s: give 0 or more seconds")
        self._core.delay_seconds = seconds

    @property
    def paused(self) -> bool:
        return self._runner is None

    def pause(self) -> None:
        """Go down as a crashed API server does: end every watch, close every connection and
        the listener, so clients get connection refused; the objects and the history stay."""
        if self._runner is None:
            return
        runner = self._runner

        async def close() -> None:
            self._core.store.close()
            for site in list(runner.sites):
                await site.stop()
            # A connection accepted just before the listener closed is set up over a few turns
            # of the loop (its accept task, then its transport's connection_made): let it
            # register, so that the cleanup closes it too (else it is left open, a transport
            # nobody closes). Counted in turns, not time: on a busy machine 50 ms may pass
            # before the loop's thread runs again, with the turns still to come.
            await asyncio.sleep(0.05)
            for _ in range(_SETUP_TURNS):
                await asyncio.sleep(0)
            server = runner.server
            await runner.cleanup()
            # One whose set-up still came after the cleanup (a busier loop than the turns above
            # allow for) registered with the server since: closed too.
            for _ in range(_SETUP_TURNS):
                await asyncio.sleep(0)
            for handler in server.connections if server is not None else ():
                handler.force_close()

        self.run(close())
        self._runner = None

    def resume(self) -> None:
        """Listen again on the same port over the same storage (watches resume, versions go on)."""
        if self._runner is not None:
            return

        async def reopen() -> web.AppRunner:
            self._core.store.reopen()
            runner, _ = await _start_site(self._core, self._host, self.port)
            return runner

        self._runner = self.run(reopen())

    def _start(self, port: int) -> None:
        self._requested_port = port
        self._thread.start()
        self._ready.wait()
        if self._startup_error is not None:
            self._thread.join()
            raise RuntimeError(
                f"the simulated API server could not listen on {self._host}:{port}:"
                f" {self._startup_error}"
            ) from self._startup_error

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._runner, self.port = self._loop.run_until_complete(
                _start_site(self._core, self._host, self._requested_port)
            )
        except BaseException as e:  # reported to the starting thread
            self._startup_error = e
            self._ready.set()
            self._loop.close()
            return
        self._ready.set()
        self._loop.run_forever()
        self._loop.close()

    def call(self, function: Callable[[], T]) -> T:
        """Run `function` on the server's loop (the store is single-threaded); return its result."""

        async def run() -> T:
            return function()

        return self.run(run())

    def run(self, coroutine: Awaitable[T]) -> T:
        """Await `coroutine` on the server's loop from another thread (at most 60 s)."""

        async def wrapper() -> T:
            return await coroutine

        future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(
            wrapper(), self._loop
        )
        return future.result(timeout=60)

    def stop(self) -> None:
        """End every watch, close the listener and connections, and join the thread."""
        if not self._thread.is_alive():
            return
        runner = self._runner

        async def shutdown() -> None:
            self._core.store.close()
            if runner is not None:
                await runner.cleanup()

        try:
            self.run(shutdown())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)

    def write_kubeconfig(self, path: Path, token: str | None = None) -> Path:
        """Write a kubeconfig for this server to `path` and return it.

        Without `token` it has no credentials: the caller is the cluster admin. With one (see
        `service_account_token`), every request carries it and is made as that service account:
        admission policies see it, and the audit log's `user` names the part that made each call.
        """
        return write_kubeconfig(self.url, path, token)

    def service_account_token(
        self, namespace: str, service_account: str, expiration_seconds: int = 3600
    ) -> str:
        """A token for the service account with the API server's audience (a TokenRequest with
        no bound object), as a part running in the cluster would present."""

        def mint() -> str:
            answer = self._core.authority.token_request(
                namespace, service_account, {"spec": {"expirationSeconds": expiration_seconds}}
            )
            return str(answer["status"]["token"])

        return self.call(mint)

    def api_client(self) -> kubernetes.client.ApiClient:
        """An official-client `ApiClient` for this server; close it when done."""
        import kubernetes.client

        configuration = kubernetes.client.Configuration()
        configuration.host = self.url
        return kubernetes.client.ApiClient(configuration)

    def mint_token(
        self,
        namespace: str,
        pod_name: str,
        audience: str = "tritonshare-agent",
        service_account: str | None = None,
        expiration_seconds: int = 3600,
    ) -> str:
        """A projected service-account token bound to the pod, as the kubelet would obtain.

        Same as a TokenRequest with `boundObjectRef` {kind: Pod, name, uid}; the pod must exist.
        `service_account` defaults to the pod's own `spec.serviceAccountName` (as the kubelet
        does); naming a different one fails as the real API does.
        """

        def mint() -> str:
            pod = self._core.store.get(PODS, namespace, pod_name)
            if pod is None:
                raise LookupError(
                    f'cannot mint a token for pod "{namespace}/{pod_name}": the pod does not'
                    " exist; create it first"
                )
            account = service_account or str(
                pod.obj.get("spec", {}).get("serviceAccountName", "default")
            )
            answer = self._core.authority.token_request(
                namespace,
                account,
                {
                    "spec": {
                        "audiences": [audience],
                        "expirationSeconds": expiration_seconds,
                        "boundObjectRef": {
                            "kind": "Pod",
                            "apiVersion": "v1",
                            "name": pod_name,
                            "uid": pod.obj["metadata"]["uid"],
                        },
                    }
                },
            )
            return str(answer["status"]["token"])

        return self.call(mint)

    def __enter__(self) -> RunningApiServer:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def start_in_thread(
    host: str = "127.0.0.1", port: int = 0, settings: ApiServerSettings | None = None
) -> RunningApiServer:
    """Start a fresh API server (default namespaces only) on its own thread; `stop()` it after.

    `host` and `port` win over those in `settings` (which sets history size, bookmark interval).
    """
    settings = dataclasses.replace(settings or ApiServerSettings(), host=host, port=port)
    core = ApiServerCore(settings)
    _create_initial_namespaces(core)
    running = RunningApiServer(core, host)
    running._start(port)
    return running


async def serve(
    settings: ApiServerSettings, stop: asyncio.Event, on_listening: Callable[[str], None]
) -> None:
    """Serve until `stop` is set (the process entry point's main coroutine)."""
    core = ApiServerCore(settings)
    _create_initial_namespaces(core)
    runner, port = await _start_site(core, settings.host, settings.port)
    url = f"http://{settings.host}:{port}"
    try:
        if settings.kubeconfig_out is not None:
            write_kubeconfig(url, settings.kubeconfig_out)
            log.info("Wrote a kubeconfig for %s to %s.", url, settings.kubeconfig_out)
        on_listening(url)
        await stop.wait()
        log.info("Stopping the simulated API server: ending watches and closing connections.")
    finally:
        core.store.close()
        await runner.cleanup()
