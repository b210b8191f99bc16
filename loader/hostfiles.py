"""A model host's files: each replica's under ROOT/<model>.<ordinal>, fetched from its storage URI.

A replica's files are fetched (loader/fetch.py: s3://, gs://, https://, with its storage Secret
and s3-* settings: loader/credentials.py) into ROOT/.fetching/<model> and renamed into place once
whole; ROOT/.sources/<model> records the URI they came from, so they are kept while the URI stays
the same and a restarted loader fetches nothing again. A fetch runs in a thread (the other
replicas go on meanwhile) and ends at its deadline, its thread at its next read. What was fetched
is laid out as Triton's model (loader/layout.py: a single file, a folder without config.pbtxt),
with the inputs and outputs of its schema when the replica names one (the `schema-path` storage
option, fetched from the same store with the same credential). The host's loader
(loader/host.py) decides when; this module only fetches, lays out and removes.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

from common.storage import schema_uri
from loader.agentclient import Hosted
from loader.credentials import StorageCredential, storage_credential
from loader.deadline import deadline_passed
from loader.errors import FetchError
from loader.fetch import check_uri, fetch
from loader.layout import MAX_SCHEMA_BYTES, lay_out

log = logging.getLogger(__name__)

SOURCES = ".sources"
"""ROOT/.sources/<model> holds the storage URI ROOT/<model> was fetched from (no model id starts
with a dot)."""
FETCHING = ".fetching"

Fetch = Callable[[str, Path, int, threading.Event, StorageCredential, float], Awaitable[str]]
"""Fetch a URI into a directory: its bytes at most, the stop event, the credential, and the
seconds it may take in all."""


async def fetch_off_loop(
    uri: str,
    directory: Path,
    max_bytes: int,
    stop: threading.Event,
    credential: StorageCredential,
    seconds: float,
) -> str:
    """loader.fetch.fetch in a thread, so the other replicas go on meanwhile."""
    return await asyncio.to_thread(
        fetch,
        uri,
        directory,
        max_bytes=max_bytes,
        stop=stop,
        headers=credential.headers,
        bucket=credential.bucket,
        deadline_seconds=seconds,
    )


class HostFiles:
    """The replicas' files under `root`; `stop` ends every fetch under way (the loader stops)."""

    def __init__(
        self,
        root: Path,
        *,
        secret_dir: Path,
        max_bytes: int,
        fetch_seconds: float,
        fetcher: Fetch,
        stop: threading.Event,
    ) -> None:
        self.root = root
        self._secret_dir = secret_dir
        """Where the host's storage Secrets are mounted (loader/credentials.py)."""
        self._max_bytes = max_bytes
        self._fetch_seconds = fetch_seconds
        self._fetch = fetcher
        self._stop = stop

    async def fetched(self, model: str, replica: Hosted) -> Path:
        """ROOT/`model` (the replica's own name) with the replica's files, fetched unless they
        are there from its storage URI already."""
        directory = self.root / model
        uri, secret = replica.storage_uri, replica.storage_secret
        options = dict(replica.storage_options)
        schema = schema_uri(uri, options)
        source = f"{uri}\n{schema}" if schema else uri
        if self._fetched(model, source):
            return directory
        check_uri(uri)
        credential = storage_credential(self._secret_dir, secret, uri, options)
        staging = self.root / FETCHING / model
        shutil.rmtree(staging, ignore_errors=True)
        log.info(
            "Fetching model %s from %s%s.",
            model,
            uri,
            f" with the credential of Secret {secret}" if secret else "",
        )
        said = await self._fetched_in_time(uri, staging, credential)
        schema_bytes = await self._schema(model, schema, credential) if schema else None
        laid = await asyncio.to_thread(lay_out, staging, replica.model_id, schema_bytes)
        (self.root / SOURCES / model).unlink(missing_ok=True)
        shutil.rmtree(directory, ignore_errors=True)
        staging.rename(directory)
        (self.root / SOURCES).mkdir(exist_ok=True)
        (self.root / SOURCES / model).write_text(source, encoding="utf-8")
        log.info("Model %s: %s%s.", model, said, f"; {laid}" if laid else "")
        return directory

    async def _schema(self, model: str, uri: str, credential: StorageCredential) -> bytes:
        """The bytes of the one file the schema URI names, fetched beside the model's."""
        staging = self.root / FETCHING / f"{model}.schema"
        shutil.rmtree(staging, ignore_errors=True)
        try:
            await self._fetched_in_time(uri, staging, credential, MAX_SCHEMA_BYTES)
            files = [f for f in staging.rglob("*") if f.is_file()]
            if len(files) != 1:
                raise FetchError(
                    f"{uri}, the model's schema, names {len(files)} files: point schemaPath at "
                    "the one JSON file"
                )
            return files[0].read_bytes()
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def remove(self, model: str) -> None:
        """Delete `model`'s files and the record of where they came from."""
        shutil.rmtree(self.root / model, ignore_errors=True)
        (self.root / SOURCES / model).unlink(missing_ok=True)

    async def _fetched_in_time(
        self, uri: str, staging: Path, credential: StorageCredential, max_bytes: int = 0
    ) -> str:
        """The fetch of at most `max_bytes` (0: the model's limit), given up at its deadline
        even when its thread is still in a read: the thread sees the same deadline at its next
        read and ends."""
        seconds = self._fetch_seconds
        most = max_bytes or self._max_bytes
        fetching = self._fetch(uri, staging, most, self._stop, credential, seconds)
        try:
            async with asyncio.timeout(seconds) as limit:
                return await fetching
        except TimeoutError as e:
            if limit.expired():
                raise deadline_passed(uri, seconds) from e
            raise

    def _fetched(self, model: str, uri: str) -> bool:
        source = self.root / SOURCES / model
        try:
            return (self.root / model).is_dir() and source.read_text(encoding="utf-8") == uri
        except OSError:
            return False
