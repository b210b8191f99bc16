"""Which Triton the node runs, read from Triton itself, for the node's annotations.

The node pod's image sets the node's Triton (a pool may pin its own): the agent asks that Triton
its version (`GET /v2`), maps it to an NGC release (`common.tritonrelease.release_of_server`) and
publishes the release and, where the release is known, its TensorRT and ONNX Runtime versions as
Node annotations. The binder places a model that needs a release (a TensorRT plan's) only on
nodes that publish it. Triton's version changes only with the node pod's image, which starts the
agent again: it is read once, retried until Triton answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Protocol

from agent.errors import TritonError
from common.contract import Keys
from common.tritonrelease import RELEASES, release_of_server

log = logging.getLogger(__name__)

RETRY_SECONDS = 5.0
"""How long the agent waits before asking a Triton that has not answered again."""


class ServerVersion(Protocol):
    async def server_version(self) -> str: ...


def triton_annotations(server: str, keys: Keys) -> dict[str, str]:
    """The Node annotations for a Triton that reports `server`: its release and, for a known
    release, its backends' versions; empty for a version no release numbering gives."""
    release = release_of_server(server)
    if release is None:
        return {}
    annotations = {keys.triton_version: release}
    known = RELEASES.get(release)
    if known is not None:
        annotations[keys.tensorrt_version] = known.tensorrt
        annotations[keys.onnxruntime_version] = known.onnxruntime
    return annotations


async def read_triton_version(
    triton: ServerVersion,
    keys: Keys,
    publish: Callable[[dict[str, str]], None],
    stop: asyncio.Event,
    *,
    retry_seconds: float = RETRY_SECONDS,
) -> None:
    """Ask Triton its version until it answers (or `stop`), then hand the annotations to
    `publish` (the node publisher writes them with its next patch)."""
    while not stop.is_set():
        try:
            server = await triton.server_version()
        except TritonError as e:
            log.debug("Triton's version is not known yet (%s): asking again shortly.", e)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), retry_seconds)
            continue
        annotations = triton_annotations(server, keys)
        if not annotations:
            log.warning(
                "Triton reports version %s, which no NGC release numbering gives: the node "
                "publishes no Triton release, and models that need one are not placed here.",
                server,
            )
        else:
            log.info(
                "The node's Triton is %s (NGC %s): publishing it on the node.",
                server,
                annotations[keys.triton_version],
            )
        publish(annotations)
        return
