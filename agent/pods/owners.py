"""Whose each model name in this node's Triton is: the name of a pod's model, and whether a pod
owns that name, may claim it, or is refused.

Each pod's model has a name of its own in Triton, which is also its repository directory, its
owner record's key, its lock and its memory figure's key: the pod's private name
(`common.tritonname`, from its namespace, model id and uid), or, for a model installed before
private names, its public id for as long as the pod that installed it lives (its owner record
says so). So two pods of one model id each have their own model, and a tenant's choice of model
id never names another's.

A name belongs to one pod uid at a time (`agent.pods.ownership` stores the records). A pod with a
proven placement (`agent.pods.provenpods`) claims its free name, or one whose recorded owner is no
longer a live pod proven for that model id; any other pod is refused without learning who the
owner is. The caller (`agent.models.nodemodels`) holds the name's lock, and removes whatever a
previous owner left before it writes the claim.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from agent.errors import InvalidRequestError, OwnedByAnotherPodError
from agent.pods.ownership import OwnerRecord, OwnerStore
from agent.pods.provenpods import Proven
from common.logs import subject
from common.tritonname import private_triton_name

log = logging.getLogger(__name__)


class Owners:
    """The ownership rules over one node's owner records."""

    def __init__(
        self, store: OwnerStore, owner_alive: Callable[[OwnerRecord], Awaitable[bool]]
    ) -> None:
        self.store = store
        self._owner_alive = owner_alive
        """Whether a recorded owner is still a live pod on this node proven for the record's
        model id (`agent.pods.nodepods.NodePods.owner_alive`); raises KubeError when that cannot be
        told."""

    def triton_name(self, owner: Proven) -> str:
        """The name of `owner`'s model in Triton: its public id when the pod installed it before
        private names (a legacy owner record of this very pod under that id), else the pod's
        private name. Another pod's legacy record never lends its name: its uid differs."""
        try:
            legacy = self.store.get(owner.model_id)
            if legacy is not None and legacy.uid == owner.uid and legacy.model_id == owner.model_id:
                return owner.model_id
            return private_triton_name(owner.namespace, owner.model_id, owner.uid)
        except ValueError as e:  # ContractError too
            raise InvalidRequestError(
                f"pod {owner.key} names model {owner.model_id!r}, which cannot be served: {e}"
            ) from e

    @staticmethod
    def check_model_id(model_id: str, owner: Proven) -> None:
        if model_id != owner.model_id:
            # The authorizer allows a pod only its annotated model; this is a programming error.
            raise InvalidRequestError(
                f"pod {owner.key} acts for model {owner.model_id!r}, not {model_id!r}"
            )

    async def claimable(self, name: str, owner: Proven) -> OwnerRecord | None:
        """The owner's record when it owns the name; None when the name is free or its recorded
        owner is gone (the caller may claim it); OwnedByAnotherPodError while another live pod
        owns it."""
        owned = self.store.get(name)
        if owned is not None and owned.uid == owner.uid:
            return owned
        if owned is not None and await self._owner_alive(owned):
            raise owned_elsewhere(owner.model_id)
        return None

    async def owns(self, name: str, owner: Proven) -> bool:
        """True when `owner` owns the name; False when nobody alive does (nothing of it is the
        caller's); OwnedByAnotherPodError when another live pod does."""
        return await self.claimable(name, owner) is not None

    def claim(self, name: str, owner: Proven) -> OwnerRecord:
        """Record `owner` as the name's owner (nothing installed for it yet)."""
        claimed = OwnerRecord(owner.uid, owner.key, owner.model_id)
        self.store.put(name, claimed)
        log.info(
            "Model %s of pod %s is named %s in Triton on this node.",
            owner.model_id,
            owner.key,
            name,
            extra=subject(pod=owner.key, model=owner.model_id),
        )
        return claimed


def owned_elsewhere(model_id: str) -> OwnedByAnotherPodError:
    return OwnedByAnotherPodError(
        f"model {model_id!r}'s name in Triton on this node belongs to another pod; delete "
        f"this pod so that it is created again, or run it when that pod is gone",
        event_reason="ModelOwnedByAnotherPod",
    )
