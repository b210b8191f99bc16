"""Owner records by name in Triton: the format written before private names is read as a legacy
record of its public id; the name a pod's model gets; one owner per name."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent.errors import OwnedByAnotherPodError
from agent.installs.repository import Repository, build_manifest
from agent.models.node import Gpus
from agent.models.nodemodels import Models
from agent.pods.modelpods import PodInfo
from agent.pods.ownership import OwnerRecord, OwnerStore
from agent.pods.provenpods import Proven
from common.manifest import ManifestEntry
from common.tritonname import private_triton_name
from tests.agent.nodeview import NoGpus, OwnersAlive, bare_models

CONFIG = b'backend: "python"\n'


def proven(namespace: str, name: str, uid: str, model_id: str) -> Proven:
    pod = PodInfo(namespace, name, uid, "node", "tritonshare", "Pending", model_id, "")
    return Proven(pod, 1024)


def test_a_record_written_before_private_names_is_read_as_its_model_ids_own(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "resnet50.owner.json").write_text(
        json.dumps({"uid": "uid-a", "pod": "team-a/a", "digest": "d" * 64})
    )
    owners = OwnerStore(state)
    owners.load()
    assert owners.get("resnet50") == OwnerRecord("uid-a", "team-a/a", "resnet50", "d" * 64)

    # A new record carries the model id beside its name, and reads back the same.
    name = private_triton_name("team-b", "resnet50", "uid-b")
    owners.put(name, OwnerRecord("uid-b", "team-b/b", "resnet50", "e" * 64))
    assert json.loads((state / f"{name}.owner.json").read_text())["modelId"] == "resnet50"
    again = OwnerStore(state)
    again.load()
    assert again.all() == owners.all()


async def owner_models(tmp_path: Path, alive: bool, gpus: Gpus | None = None) -> Models:
    repository = Repository(tmp_path / "models")
    repository.prepare()
    owners = OwnerStore(tmp_path / "state")
    owners.load()

    models = bare_models(
        repository,
        owners,
        frozenset({"team-a", "team-b"}),
        gpus=gpus or NoGpus(),
        pods=OwnersAlive(alive),
    )

    async def not_in_triton(name: str) -> None:
        return None

    models.triton.state = not_in_triton  # type: ignore[method-assign]
    return models


async def test_a_pods_name_is_its_legacy_id_only_when_its_own_record_holds_it(
    tmp_path: Path,
) -> None:
    models = await owner_models(tmp_path, alive=True)
    try:
        models.owners.put("resnet50", OwnerRecord("uid-a", "team-a/a", "resnet50"))
        legacy, other = (
            proven("team-a", "a", "uid-a", "resnet50"),
            proven("team-b", "b", "uid-b", "resnet50"),
        )
        assert models.triton_name(legacy) == "resnet50"
        assert models.triton_name(other) == private_triton_name("team-b", "resnet50", "uid-b")
        # A private record under another pod's model id lends that pod nothing.
        squat = private_triton_name("team-a", "x", "uid-a")
        models.owners.put(squat, OwnerRecord("uid-a", "team-a/a", "x"))
        named = proven("team-b", "b", "uid-b", squat)
        assert models.triton_name(named) == private_triton_name("team-b", squat, "uid-b")
    finally:
        await models.close()


@pytest.mark.parametrize("alive", [True, False], ids=["owner-alive", "owner-gone"])
async def test_one_owner_per_name_in_triton(tmp_path: Path, alive: bool) -> None:
    """A name whose recorded owner is another live pod is refused (it takes a digest collision
    to get there); one whose owner is gone is claimed, and what it left is removed first."""
    models = await owner_models(tmp_path, alive=alive)
    pod = proven("team-b", "b", "uid-b", "m")
    name = models.triton_name(pod)
    models.owners.put(name, OwnerRecord("uid-a", "team-a/a", "m"))
    left = models.repository.root / name
    left.mkdir()
    manifest = build_manifest(
        "m", [ManifestEntry("config.pbtxt", len(CONFIG), hashlib.sha256(CONFIG).hexdigest())]
    )

    async def chunks() -> AsyncIterator[tuple[str, int, bytes]]:
        yield "config.pbtxt", 0, CONFIG

    try:
        if alive:
            with pytest.raises(OwnedByAnotherPodError, match="belongs to another pod"):
                await models.install("m", manifest, chunks(), pod)
            assert models.owners.get(name) == OwnerRecord("uid-a", "team-a/a", "m")
            assert left.exists()
        else:
            result = await models.install("m", manifest, chunks(), pod)
            assert not result.unchanged
            owner = models.owners.get(name)
            assert owner is not None and (owner.uid, owner.model_id) == ("uid-b", "m")
            assert (left / "config.pbtxt").read_bytes() == CONFIG
    finally:
        await models.close()
