"""A pod's model's private name in the node's shared Triton (DESIGN.md, "Contract").

Clients name a model by its public id (the `model-id` annotation). In Triton each pod's model has
a name of its own, derived here from what makes the model that pod's: its namespace, its model id
and the pod's uid. So two pods of one model id (two namespaces that both call theirs `resnet50`,
or a rollout's old and new revision) load two models into one Triton, and neither can name the
other's. The agent installs and loads under this name, the caller table carries it, the gateway
maps the public id to it in each request and back in each answer, and the binder finds a pod's
measured memory by it.

The name is the model id cut to 103 characters, a dash, and 24 hex digits (96 bits) of a
SHA-256 over a version tag and the three inputs, each preceded by its length (so no two triples
share an input string). It keeps the model-id grammar (`[A-Za-z0-9_.-]`, at most 128 characters,
not starting with a dot), which is also within Triton's rules (no `/`).

Why a tenant cannot pick a name that collides with another pod's:
- Every model installed since private names is named by this function, and the uid in it is the
  API server's, assigned at the pod's creation; two names are equal only when their 96-bit
  digests are, so a tenant would have to find a second SHA-256 preimage of 96 bits, or have the
  API server hand its pod a chosen uid, whatever namespace, model id or pod name it picks.
- A tenant's public model id is never a name in Triton by itself: a model id equal to another
  pod's private name (or to a model installed before private names, which still carries its
  public id as its name) is only the prefix of that tenant's own private name, whose digest
  covers its own namespace and uid.
- A model installed before private names keeps its public id as its Triton name only for the pod
  that installed it (its owner record has that pod's uid); no other pod is given that name.
"""

from __future__ import annotations

import hashlib

from common.contract import validate_model_id

DIGEST_HEX = 24
"""Hex digits of the digest in a private name (96 bits)."""
_PREFIX_LENGTH = 128 - 1 - DIGEST_HEX
_TAG = b"tritonshare.io/triton-name/v1"


def private_triton_name(namespace: str, model_id: str, pod_uid: str) -> str:
    """The name of the model of pod `pod_uid` in `namespace`, whose public id is `model_id`, in
    the node's Triton; ContractError when `model_id` breaks the model-id grammar, ValueError when
    the namespace or uid is empty."""
    validate_model_id(model_id)
    if not namespace or not pod_uid:
        raise ValueError("a private Triton name needs the pod's namespace and uid")
    digest = hashlib.sha256(_TAG)
    for part in (namespace, model_id, pod_uid):
        data = part.encode()
        digest.update(b"%d:" % len(data))
        digest.update(data)
    return f"{model_id[:_PREFIX_LENGTH]}-{digest.hexdigest()[:DIGEST_HEX]}"
