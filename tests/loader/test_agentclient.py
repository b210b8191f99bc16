"""The client's wire behaviour against a grpc.aio server that implements the generated servicer
and records what it receives: the bearer token (re-read per call), the header-then-chunks
stream, and how the agent's status codes come back to the loader.

The end-to-end behaviour against the real agent is in test_process.py.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import grpc.aio
import pytest

from loader.agentclient import AgentClient, ModelState
from loader.errors import InvalidModelError, ModelRejectedError, RefusedError, TransientError
from loader.manifest import build_manifest
from loader.validate import ModelDirectory, validate_model_directory
from protos import agent_pb2, agent_pb2_grpc
from tests.agentserver import agent_server
from tests.conftest import copy_model


@dataclass
class RecordingAgent(agent_pb2_grpc.AgentServicer):  # type: ignore[misc]
    """Keeps every token and install stream it sees; answers from `fail_with` if set."""

    tokens: list[str] = field(default_factory=list)
    headers: list[agent_pb2.InstallHeader] = field(default_factory=list)
    files: dict[str, bytearray] = field(default_factory=dict)
    chunks: int = 0
    fail_with: tuple[grpc.StatusCode, str] | None = None

    async def _check(self, context: grpc.aio.ServicerContext[object, object]) -> None:
        metadata = dict(context.invocation_metadata() or ())
        self.tokens.append(str(metadata.get("authorization", "")))
        if self.fail_with is not None:
            await context.abort(*self.fail_with)

    async def GetModel(  # noqa: N802 - the generated servicer's name
        self,
        request: agent_pb2.GetModelRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> agent_pb2.ModelStatus:
        await self._check(context)
        await context.abort(grpc.StatusCode.NOT_FOUND, f"model {request.model_id} is not here")
        raise AssertionError("abort returns only by raising")

    async def LoadModel(  # noqa: N802
        self,
        request: agent_pb2.LoadModelRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> agent_pb2.ModelStatus:
        await self._check(context)
        return agent_pb2.ModelStatus(
            model_id=request.model_id, state=agent_pb2.MODEL_STATE_READY, gpu_index=-1
        )

    async def InstallModel(  # noqa: N802
        self,
        request_iterator: AsyncIterator[agent_pb2.InstallModelRequest],
        context: grpc.aio.ServicerContext[object, object],
    ) -> agent_pb2.InstallModelResponse:
        if self.fail_with is not None:
            # Like the real agent, which judges digests once a file's bytes are in: read the
            # stream, then answer. Ending it early races grpc-core's client, which may then
            # report loader.errors.CUT_STREAM_DETAILS instead of this answer.
            async for _ in request_iterator:
                pass
        await self._check(context)
        received = 0
        async for request in request_iterator:
            if request.HasField("header"):
                assert not self.headers, "the header comes once, first"
                self.headers.append(request.header)
                continue
            assert self.headers, "a chunk came before the header"
            chunk = request.chunk
            data = self.files.setdefault(chunk.path, bytearray())
            assert chunk.offset == len(data), "chunks come in order of offset"
            data.extend(chunk.data)
            received += len(chunk.data)
            self.chunks += 1
        return agent_pb2.InstallModelResponse(
            model_id=self.headers[0].model_id, bytes_written=received
        )


@pytest.fixture
async def agent() -> AsyncIterator[tuple[RecordingAgent, str]]:
    servicer = RecordingAgent()
    async with agent_server(servicer) as address:
        yield servicer, address


@pytest.fixture
def model(tmp_path: Path) -> ModelDirectory:
    root = copy_model("add_one", tmp_path)
    (root / "1" / "weights.bin").write_bytes(bytes(range(256)) * 10_000)  # 2.5 MB: 3 chunks
    (root / "1" / "empty.txt").write_bytes(b"")
    return validate_model_directory(root, "add_one", 10**9)


async def test_the_install_stream_carries_the_manifest_then_every_byte(
    agent: tuple[RecordingAgent, str], model: ModelDirectory, tmp_path: Path
) -> None:
    servicer, address = agent
    token = tmp_path / "token"
    token.write_text("first-token\n")
    manifest = build_manifest(model.files)
    client = AgentClient(address, token, chunk_bytes=1024 * 1024, reconnect_max_seconds=1.0)
    try:
        result = await client.install(model, manifest, 30.0)
    finally:
        await client.close()
    header = servicer.headers[0]
    assert header.model_id == "add_one"
    assert [(f.path, f.size, f.sha256) for f in header.manifest.files] == [
        (e.path, e.size, e.sha256) for e in manifest.files
    ]
    for entry in manifest.files:
        data = bytes(servicer.files.get(entry.path, b""))
        assert hashlib.sha256(data).hexdigest() == entry.sha256, entry.path
    assert "1/empty.txt" not in servicer.files, "an empty file is created from the manifest alone"
    assert servicer.chunks == 3 + 2  # weights.bin in three chunks, config.pbtxt and model.py
    assert result.bytes_sent == manifest.total_bytes == result.bytes_written
    assert servicer.tokens == ["Bearer first-token"]


async def test_the_token_is_read_again_for_every_call(
    agent: tuple[RecordingAgent, str], tmp_path: Path
) -> None:
    servicer, address = agent
    token = tmp_path / "token"
    token.write_text("before-rotation")
    client = AgentClient(address, token, chunk_bytes=1024, reconnect_max_seconds=1.0)
    try:
        absent = await client.get_model("add_one", 5.0)
        token.write_text("after-rotation")
        ready = await client.load("add_one", 5.0)
    finally:
        await client.close()
    assert absent.state is ModelState.ABSENT
    assert ready.state is ModelState.READY
    assert ready.describe_placement() == "the CPU"
    assert servicer.tokens == ["Bearer before-rotation", "Bearer after-rotation"]


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (grpc.StatusCode.UNAUTHENTICATED, RefusedError),
        (grpc.StatusCode.PERMISSION_DENIED, RefusedError),
        (grpc.StatusCode.FAILED_PRECONDITION, ModelRejectedError),
        (grpc.StatusCode.UNAVAILABLE, TransientError),
    ],
)
async def test_agent_status_codes_reach_the_loader_classified(
    agent: tuple[RecordingAgent, str],
    tmp_path: Path,
    code: grpc.StatusCode,
    expected: type[Exception],
) -> None:
    servicer, address = agent
    servicer.fail_with = (code, "the agent's own words")
    token = tmp_path / "token"
    token.write_text("t")
    client = AgentClient(address, token, chunk_bytes=1024, reconnect_max_seconds=1.0)
    try:
        with pytest.raises(expected, match="the agent's own words"):
            await client.load("add_one", 5.0)
    finally:
        await client.close()


async def test_a_file_that_grows_while_being_sent_is_reported_as_such(
    agent: tuple[RecordingAgent, str], model: ModelDirectory, tmp_path: Path
) -> None:
    _, address = agent
    token = tmp_path / "token"
    token.write_text("t")
    manifest = build_manifest(model.files)
    with (model.root / "1" / "weights.bin").open("ab") as grow:
        grow.write(b"more")
    client = AgentClient(address, token, chunk_bytes=1024 * 1024, reconnect_max_seconds=1.0)
    try:
        with pytest.raises(InvalidModelError, match=r"1/weights\.bin .* changed size"):
            await client.install(model, manifest, 30.0)
    finally:
        await client.close()


async def test_a_digest_mismatch_from_a_file_edited_after_hashing_is_not_retried(
    agent: tuple[RecordingAgent, str], model: ModelDirectory, tmp_path: Path
) -> None:
    servicer, address = agent
    token = tmp_path / "token"
    token.write_text("t")
    manifest = build_manifest(model.files)
    client = AgentClient(address, token, chunk_bytes=1024 * 1024, reconnect_max_seconds=1.0)
    servicer.fail_with = (grpc.StatusCode.DATA_LOSS, "sha256 differs from the manifest")
    try:
        # Bytes damaged on the way (the files on disk are as hashed): worth sending again.
        with pytest.raises(TransientError, match="sha256 differs"):
            await client.install(model, manifest, 30.0)
        # A file edited in place after hashing (same size): sending again cannot help.
        (model.root / "1" / "model.py").write_text(
            (model.root / "1" / "model.py").read_text().replace("+ 1", "+ 2")
        )
        with pytest.raises(InvalidModelError, match=r"1/model\.py .* changed while being sent"):
            await client.install(model, manifest, 30.0)
    finally:
        await client.close()


@dataclass
class KeepingAgent(RecordingAgent):
    """Answers InstallKept: from `kept_answer`, or with `fail_with`."""

    kept_answer: agent_pb2.InstallModelResponse | None = None

    async def InstallKept(  # noqa: N802
        self,
        request: agent_pb2.InstallHeader,
        context: grpc.aio.ServicerContext[object, object],
    ) -> agent_pb2.InstallModelResponse:
        await self._check(context)
        self.headers.append(request)
        if self.kept_answer is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, "this node keeps no copy")
        assert self.kept_answer is not None
        return self.kept_answer


async def test_asking_for_the_nodes_kept_copy_sends_only_the_header(
    model: ModelDirectory, tmp_path: Path
) -> None:
    """A hit installs with nothing sent; a miss, or an agent without InstallKept, answers None
    (the loader then sends the files); a refusal is the agent's refusal."""
    token = tmp_path / "token"
    token.write_text("t")
    manifest = build_manifest(model.files)
    for servicer, expected in (
        (RecordingAgent(), None),
        (KeepingAgent(), None),
        (
            KeepingAgent(
                kept_answer=agent_pb2.InstallModelResponse(
                    model_id="add_one",
                    manifest_digest=manifest.digest,
                    bytes_written=manifest.total_bytes,
                    kept=True,
                )
            ),
            manifest.total_bytes,
        ),
        (KeepingAgent(fail_with=(grpc.StatusCode.PERMISSION_DENIED, "not yours")), RefusedError),
    ):
        server = grpc.aio.server()
        agent_pb2_grpc.add_AgentServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        client = AgentClient(f"127.0.0.1:{port}", token, chunk_bytes=1024, reconnect_max_seconds=1)
        try:
            if expected is RefusedError:
                with pytest.raises(RefusedError, match="not yours"):
                    await client.install_kept("add_one", manifest, 10.0)
                continue
            result = await client.install_kept("add_one", manifest, 10.0)
            if expected is None:
                assert result is None
            else:
                assert result is not None
                assert (result.bytes_written, result.bytes_sent) == (expected, 0)
                assert result.manifest_digest == manifest.digest
            assert servicer.chunks == 0
        finally:
            await client.close()
            await server.stop(None)
