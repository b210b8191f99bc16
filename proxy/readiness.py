"""Whether the pod is ready: every model of its table (a model pod's one, a host's all) is ready
in Triton, asleep (an on-demand model unloaded while idle, that its next request loads) or parked
(at zero replicas, that its next request scales up), and the proxy is not draining. A table whose
every model is asleep or parked is ready without asking Triton (`ProxyState.model_asleep`, the
same rule as the REST and gRPC readiness answers); an empty table is not ready.

`Readiness.not_ready` is the callback common/health.py's /readyz awaits. It asks Triton through
`OwnModel`, over one client session held for the process (closed at shutdown). It serves nothing
and changes nothing. When the model is not ready, the reason is the reinstaller's when it knows
one (the model is missing on the node and being reinstalled, the agent cannot be reached, the node
refused it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Collection
from typing import Any

import aiohttp

from proxy.policy.routing import NODE_STOPPING
from proxy.processflags import ProxyState
from proxy.settings import Settings
from proxy.sockets import local_address


class _KeyedConnector(aiohttp.TCPConnector):
    """aiohttp's connector, each new connection beginning with the pod's caller key (the node
    gateway reads it before the request); aiohttp has no public hook between connect and the
    first request, so this wraps aiohttp 3's `_wrap_create_connection` (the full path's tests
    would see it change)."""

    def __init__(self, state: ProxyState, local_addr: tuple[str, int] | None) -> None:
        super().__init__(local_addr=local_addr)
        self._state = state

    async def _wrap_create_connection(self, *args: Any, **kwargs: Any) -> Any:
        transport, protocol = await super()._wrap_create_connection(*args, **kwargs)
        if self._state.caller_key:
            transport.write(self._state.caller_key)
        return transport, protocol


class OwnModel:
    """Asks Triton whether the pod's model is ready, over one client session held for the
    process (opened at start, closed at stop).

    While the node pod stops, the node gateway answers a model pod it takes out of its Service
    not ready, saying so (`routing.NODE_STOPPING`): each answer about the pod's own model tells
    `on_node_stop` why the pod leaves ('' once an answer no longer says so)."""

    def __init__(
        self,
        settings: Settings,
        state: ProxyState,
        on_node_stop: Callable[[str], None] = lambda why: None,
    ) -> None:
        self._models = f"http://{settings.triton_http_url}/v2/models/"
        self._model_id = settings.model_id
        self._source = settings.source_address
        self._state = state
        self._on_node_stop = on_node_stop
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=5),
            # Through the node gateway, which knows the pod by its key or this address.
            connector=_KeyedConnector(self._state, local_address(self._source)),
        )

    async def stop(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def watch(self, stopping: asyncio.Event, period: float) -> None:
        """Ask about the pod's model every `period` seconds until `stopping` (what the reinstall
        watch does where there is none)."""
        while not stopping.is_set():
            await self.ready()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), period)

    async def ready(self) -> bool:
        """True when Triton reports the pod's model ready."""
        return await self.is_ready(self._model_id)

    async def is_ready(self, model_id: str) -> bool:
        """True when Triton reports `model_id` ready."""
        if self._session is None:
            return False
        try:
            async with self._session.get(f"{self._models}{model_id}/ready") as response:
                if model_id == self._model_id:
                    self._on_node_stop(await _node_stop(response))
                return response.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def config(self, model_id: str) -> dict[str, Any] | None:
        """`model_id`'s config as Triton has it loaded (its JSON); None when Triton does not
        answer one (the model not loaded, Triton or the node gateway away)."""
        if self._session is None:
            return None
        try:
            async with self._session.get(f"{self._models}{model_id}/config") as response:
                said = await response.read()
                if response.status != 200:
                    return None
        except (aiohttp.ClientError, TimeoutError):
            return None
        try:
            config = json.loads(said)
        except ValueError:
            return None
        return config if isinstance(config, dict) else None


async def _node_stop(response: aiohttp.ClientResponse) -> str:
    """Why the gateway's answer says the pod leaves its Service as its node pod stops; '' when
    it does not say so."""
    if response.status != 503:
        return ""
    try:
        said = json.loads(await response.read())
    except ValueError:
        return ""
    if not isinstance(said, dict) or said.get(NODE_STOPPING) is not True:
        return ""
    return str(said.get("error") or "the node pod is stopping")


ASLEEP = "asleep (unloaded while idle)"
"""How /readyz's text says an on-demand model is asleep."""
PARKED = "parked (at zero replicas)"
"""How /readyz's text says a model is parked on this host."""


class Readiness:
    """Answers why the pod is not ready, asking Triton about each model it has loaded."""

    def __init__(
        self,
        state: ProxyState,
        own_model: OwnModel,
        table: Collection[str],
        why_not_served: Callable[[], str] = lambda: "",
        asleep: Callable[[str], str] = lambda model_id: "",
    ) -> None:
        self._state = state
        self._own_model = own_model
        self._why_not_served = why_not_served
        """What is known of why the model is not served ('' when nothing is): proxy.reinstall."""
        self._table = table
        """The model ids of the proxy's table (live): a host's, or a model pod's one."""
        self._asleep = asleep
        """`ASLEEP` or `PARKED` for a model not asked about (its next request loads it), ''
        for one Triton should have loaded."""

    async def not_ready(self) -> list[str]:
        """The reasons the pod is not ready; none when it is."""
        if self._state.draining:
            return ["draining: the pod is shutting down"]
        if not self._table:
            return ["the models file lists no model yet"]
        if self._state.model_asleep:
            return []
        models = sorted(m for m in self._table if not self._asleep(m))
        answers = await asyncio.gather(*(self._own_model.is_ready(m) for m in models))
        why = self._why_not_served()
        return [
            why or f"model {model} is not ready in Triton"
            for model, ready in zip(models, answers, strict=True)
            if not ready
        ]

    def ready_text(self) -> str:
        """The /readyz body when ready: names each model asleep or parked, and says when the
        pod is ready by itself (none of its models is loaded)."""
        every = self._state.model_asleep
        said = [
            f"model {model} is {self._asleep(model) or ASLEEP}"
            for model in sorted(self._table)
            if every or self._asleep(model)
        ]
        if not said:
            return "ready"
        if every:
            said.append(
                "its next request loads it"
                if len(said) == 1
                else "each one's next request loads it"
            )
        return "ready: " + "; ".join(said)
