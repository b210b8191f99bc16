"""Pytest fixtures for the simulated cluster: a fresh in-memory API server per test.

`apiserver` is a `RunningApiServer` (stopped after the test), `kube_api` an official-client
`ApiClient` for it (closed after), `kubeconfig` the path of a kubeconfig file pointing at it,
`placement_keys` the placement-key Secret as the binder and agents mount it (and the ring, so a
test can sign a placement as the binder would).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes.client
import kubernetes.watch
import pytest

from common.proofs import Claim, KeyRing, load_key_ring
from sim.apiserver import RunningApiServer, start_in_thread
from sim.cluster import write_placement_keys

TEST_PLACEMENT_KEY = b"tritonshare tests: placement key, not a secret"
TEST_RING = KeyRing(TEST_PLACEMENT_KEY)
"""The ring tests sign with where they stand in for the binder (agents started with
`write_test_placement_key`'s directory accept it)."""


def write_test_placement_key(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "current").write_bytes(TEST_PLACEMENT_KEY)
    return directory


def sign_placement(
    api: kubernetes.client.ApiClient,
    namespace: str,
    name: str,
    *,
    request: int = 1024**3,
    ring: KeyRing = TEST_RING,
    prefix: str = "tritonshare.io/",
) -> str:
    """Write the placement proof on a bound pod as the binder would (from the pod as it is
    now), and return it."""
    core: Any = kubernetes.client.CoreV1Api(api)
    pod = core.read_namespaced_pod(name, namespace)
    annotations = pod.metadata.annotations or {}
    claim = Claim(
        pod.metadata.uid,
        namespace,
        name,
        pod.spec.node_name or "",
        annotations.get(f"{prefix}gpu", ""),
        annotations.get(f"{prefix}model-id", ""),
        request,
        annotations.get(f"{prefix}residency", "always"),
    )
    proof = ring.sign(claim)
    core.patch_namespaced_pod(
        name, namespace, {"metadata": {"annotations": {f"{prefix}placement": proof}}}
    )
    return proof


@dataclass(frozen=True)
class PlacementKeys:
    directory: Path
    ring: KeyRing


@pytest.fixture
def placement_keys(tmp_path: Path) -> PlacementKeys:
    """A fresh placement-key directory (file `current`), as the mounted Secret looks."""
    directory = write_placement_keys(tmp_path / "placement-key")
    return PlacementKeys(directory, load_key_ring(directory))


@pytest.fixture
def apiserver() -> Iterator[RunningApiServer]:
    """A fresh simulated API server (namespaces default, kube-system, tritonshare-system)."""
    server = start_in_thread()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def kube_api(apiserver: RunningApiServer) -> Iterator[kubernetes.client.ApiClient]:
    """An official `kubernetes` ApiClient talking to `apiserver`."""
    client = apiserver.api_client()
    try:
        yield client
    finally:
        client.close()  # type: ignore[no-untyped-call]


@pytest.fixture
def kubeconfig(apiserver: RunningApiServer, tmp_path: Path) -> Path:
    """A kubeconfig file for `apiserver`, usable by `kubernetes.config.load_kube_config`."""
    return apiserver.write_kubeconfig(tmp_path / "kubeconfig")


def core_v1(api: kubernetes.client.ApiClient) -> Any:
    """CoreV1Api typed as Any: the client's models make every field Optional, so typed tests
    would need a None check on each attribute they read."""
    return kubernetes.client.CoreV1Api(api)


def apps_v1(api: kubernetes.client.ApiClient) -> Any:
    """AppsV1Api typed as Any (see core_v1)."""
    return kubernetes.client.AppsV1Api(api)


def coordination_v1(api: kubernetes.client.ApiClient) -> Any:
    """CoordinationV1Api typed as Any (see core_v1)."""
    return kubernetes.client.CoordinationV1Api(api)


def authentication_v1(api: kubernetes.client.ApiClient) -> Any:
    """AuthenticationV1Api typed as Any (see core_v1)."""
    return kubernetes.client.AuthenticationV1Api(api)


def new_watch() -> Any:
    """A `kubernetes.watch.Watch` (the module is untyped)."""
    return kubernetes.watch.Watch()  # type: ignore[no-untyped-call]


def status_of(error: kubernetes.client.ApiException) -> dict[str, Any]:
    """The `Status` body of a failed call."""
    body: dict[str, Any] = json.loads(error.body or "{}")
    return body
