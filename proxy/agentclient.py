"""The proxy's one call to the node agent: unload the pod's model when the pod terminates.

The call carries `authorization: Bearer <token>`, the pod's projected service-account token read
from its file at call time (the kubelet rotates it), so the agent can check with TokenReview that
the caller is the pod owning the model. Failures are logged, never raised: the agent also unloads
models of pods that are gone, so a missed call delays freeing memory but loses nothing.
"""

from __future__ import annotations

import logging
from pathlib import Path

import grpc
import grpc.aio

from protos import agent_pb2, agent_pb2_grpc

log = logging.getLogger(__name__)


class AgentClient:
    """Asks the agent at `address` to unload `model_id`, authenticated by `token_file`."""

    def __init__(self, address: str, token_file: Path, timeout: float) -> None:
        self._address = address
        self._token_file = token_file
        self._timeout = timeout

    async def unload(self, model_id: str) -> bool:
        """Ask for the unload and wait for the answer; True when the agent confirmed it."""
        try:
            token = self._token_file.read_text().strip()
        except OSError as e:
            log.error(
                "Cannot read the pod's token file %s (%s): not asking the agent to unload model "
                "%s; the agent will unload it once it sees the pod gone.",
                self._token_file,
                e.strerror,
                model_id,
            )
            return False
        async with grpc.aio.insecure_channel(self._address) as channel:
            stub = agent_pb2_grpc.AgentStub(channel)
            try:
                status = await stub.UnloadModel(
                    agent_pb2.UnloadModelRequest(model_id=model_id),
                    metadata=(("authorization", f"Bearer {token}"),),
                    timeout=self._timeout,
                )
            except grpc.aio.AioRpcError as e:
                log.error(
                    "The agent at %s refused or failed to unload model %s (%s: %s); it will "
                    "unload it once it sees the pod gone.",
                    self._address,
                    model_id,
                    e.code().name,
                    e.details(),
                )
                return False
        log.info(
            "The agent at %s unloaded model %s (state %s).",
            self._address,
            model_id,
            agent_pb2.ModelState.Name(status.state),
        )
        return True
