"""The model-host contract: how a host pod names the TritonModel replicas it serves.

The binder creates one host pod per namespace, node and storage Secret (none is one) with a
replica placed there (`binder.tritonmodels.controller`), so a model that needs a Secret no host
mounts gets a host of its own instead of a new one for its neighbours. It is the only writer of
what this module names on it:

- label `<prefix>model-host: "true"`;
- annotation `<prefix>host-template`: the hash of the pod template it was made from;
- annotation `<prefix>host-secret`: the storage Secret its loader mounts (absent: none), which
  every replica it names fetches with and its name is made from (`host_name`);
- annotation `<prefix>hosted-models`: a JSON list of `HostedReplica`, one per replica placed on the
  host's node (several replicas of one model may share it, each with its own GPU and proof), each
  with the TritonModel's name and, where its spec.modelName differs, `modelId`: the id its
  clients send;
- annotation `<prefix>parked-models`: a JSON list (`{"model", "maxConcurrency"}`, and `modelId`
  as above) of the namespace's models at zero replicas parked on the host (scale to zero: the
  host's proxy holds their requests, by model id, until a replica is ready);
- label `<prefix>serves-<model>: "true"` for each model with a replica loaded, ready and not
  draining there (what the model's Service selects), read from the agent's conditions below;
  `"asleep"` (`SERVES_ASLEEP`, outside the Service) for an on-demand model asleep there while
  another replica of the model is awake.

The agent reads the annotation, proves each replica's proof as it proves a pod's (the claim of a
pod of uid `<model uid>/<replica>`, name `<model>/<replica>`, in the host's namespace, on the
host's node) and writes, on the host pod, the condition `<prefix>loaded-<model>_<replica>`: True
when Triton serves it there. None of it is proof of anything by itself: a tenant can edit its own
namespace's pods, so only the signed proof decides.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from common.contract import (
    RESIDENCIES,
    RESIDENCY_ALWAYS,
    SECRET_NAME,
    ContractError,
    Keys,
    validate_model_id,
)
from common.storage import read_storage_options

HOST_PREFIX = "tritonshare-host-"
"""Name of a namespace's model host on a node: this prefix and a hash of the node's name (and of
its storage Secret's)."""
HOST_CONTAINERS = ("loader", "proxy")
"""The containers of a host pod: the loader follows the host's replicas, the proxy serves them."""


class HostedError(ContractError):
    """A hosted-models annotation that cannot be read; the message says what is wrong."""


HOST_STORAGE_SCHEMES = ("s3", "gs", "https")
"""The storage URIs a host's loader fetches (`loader.fetch`), as a model pod's storage initializer
does; pvc:// is a model pod's alone (a running host cannot mount a new claim)."""


def host_storage_problem(uri: str, secret: str = "") -> str:
    """Why a model host cannot fetch `uri` with the credential Secret `secret` ("" when it
    can), in words for the model's owner."""
    scheme = uri.partition("://")[0].lower() if "://" in uri else ""
    if scheme == "pvc":
        return (
            f"storageUri {uri!r}: a model host cannot read a PersistentVolumeClaim (a running "
            f"pod cannot mount a new one); serve this model as a model pod, whose storage "
            f"initializer mounts the claim, or copy its files to s3://, gs:// or https://"
        )
    if scheme not in HOST_STORAGE_SCHEMES:
        return (
            f"storageUri {uri!r}: model hosts fetch s3://, gs:// and https:// (not plain "
            f"http://, as model pods); publish the model there"
        )
    if secret and not SECRET_NAME.fullmatch(secret):
        return (
            f"storageSecret {secret!r} is not a Secret name; write the name of a Secret in the "
            f"model's own namespace (lower-case letters, digits, '-' and '.')"
        )
    return ""


def host_name(node: str, secret: str = "") -> str:
    """The pod name of the model host on `node` whose replicas fetch with the storage Secret
    `secret` ("": the host of the replicas with none), the same in every namespace."""
    key = f"{node}\0{secret}" if secret else node
    return HOST_PREFIX + hashlib.sha256(key.encode()).hexdigest()[:16]


def host_group(namespace: str, secret: str = "") -> str:
    """The key of a namespace's hosts of one storage Secret ("": none) among all hosts: the
    namespace, or `<namespace>/<Secret>` (neither name has a slash)."""
    return f"{namespace}/{secret}" if secret else namespace


def group_namespace(group: str) -> str:
    """The namespace of a `host_group`."""
    return group.partition("/")[0]


def host_secret_annotation(keys: Keys) -> str:
    """Host pod annotation: the storage Secret the host mounts (absent on the host of the
    replicas without one)."""
    return f"{keys.prefix}host-secret"


def host_label(keys: Keys) -> str:
    """Label on every model host pod the binder creates (value "true")."""
    return f"{keys.prefix}model-host"


def host_template_annotation(keys: Keys) -> str:
    """Host pod annotation: the hash of the template the binder made it from (a host without it,
    or with another, is replaced)."""
    return f"{keys.prefix}host-template"


def hosted_models_annotation(keys: Keys) -> str:
    """Host pod annotation: the JSON list of the replicas it serves (`HostedReplica`)."""
    return f"{keys.prefix}hosted-models"


def parked_models_annotation(keys: Keys) -> str:
    """Host pod annotation: the JSON list of the models of its namespace parked on it at zero
    replicas (`encode_parked`), whose requests its proxy holds until a replica is ready here."""
    return f"{keys.prefix}parked-models"


class Parked(NamedTuple):
    """A model parked on a host (`<prefix>parked-models`)."""

    model: str
    """The TritonModel's name."""
    model_id: str
    """The id its clients send (spec.modelName, else `model`): what the host's proxy holds."""
    max_concurrency: int


def encode_parked(models: Iterable[Parked]) -> str:
    """The parked-models annotation's value for `models`, sorted; `modelId` only where it
    differs from the TritonModel's name, as in the hosted-models annotation."""
    entries = [
        {"model": m.model, "maxConcurrency": m.max_concurrency}
        | ({"modelId": m.model_id} if m.model_id != m.model else {})
        for m in sorted(set(models))
    ]
    return json.dumps(entries, separators=(",", ":"))


def decode_parked(value: str, most: int) -> tuple[list[Parked], str]:
    """The parked models of an annotation's value, at most `most`, and what is wrong with it
    ("" when nothing is): a malformed value or an invalid model name or id parks nothing."""
    if not value.strip():
        return [], ""
    try:
        data = json.loads(value)
    except ValueError as e:
        return [], f"the parked-models annotation is not JSON ({e})"
    if not isinstance(data, list):
        return [], "the parked-models annotation is not a JSON list"
    if len(data) > most:
        return [], f"the parked-models annotation names {len(data)} models, more than {most}"
    found = {}
    for item in data:
        entry = item if isinstance(item, dict) else {}
        model, limit = entry.get("model"), entry.get("maxConcurrency", 0)
        model_id = entry.get("modelId", model)
        if (
            not isinstance(model, str)
            or not isinstance(model_id, str)
            or isinstance(limit, bool)
            or not isinstance(limit, int)
        ):
            return [], (
                "a parked-models entry has no `model`, a `modelId` that is not a string or no "
                "whole `maxConcurrency`"
            )
        try:
            validate_model_id(model)
            validate_model_id(model_id)
        except ContractError as e:
            return [], f"the parked-models annotation: {e}"
        found[model] = Parked(model, model_id, max(0, limit))
    return sorted(found.values()), ""


def _qualified(keys: Keys, word: str, model: str) -> str:
    """`<prefix><word>-<model>`; a label or condition name part has at most 63 characters, so a
    longer one keeps the model's first 40 and a hash of the whole."""
    name = f"{word}-{model}"
    if len(name) > 63:
        digest = hashlib.sha256(model.encode()).hexdigest()[:15]
        name = f"{word}-{model[:40].rstrip('.-_')}-{digest}"
    return f"{keys.prefix}{name}"


SERVES_ASLEEP = "asleep"
"""The `serves-<model>` value of a host whose replica sleeps while another one is awake."""


def serves_label(keys: Keys, model: str) -> str:
    """The host label that puts the host behind model `model`'s Service (value "true"): set by
    the binder while the replica is loaded and ready on the host, removed before it leaves."""
    return _qualified(keys, "serves", model)


def loaded_condition(keys: Keys, model: str, replica: int) -> str:
    """The host pod condition the agent writes for replica `replica` of `model`: True when
    Triton serves it there (as a model pod's `<prefix>ModelLoaded`). `_` is in no TritonModel's
    name, so no two replicas' conditions share a name."""
    return _qualified(keys, "loaded", f"{model}_{replica}")


def loaded_prefix(keys: Keys) -> str:
    """What every loaded condition's type begins with."""
    return f"{keys.prefix}loaded-"


SLEEPING_REASON = "ModelSleeping"
"""The reason of a loaded condition False for an on-demand model unloaded while idle (files kept):
its pod or host stays routed, as its proxy wakes it on the next request."""


NODE_STOPPING_REASON = "NodePodStopping"
"""The reason of a loaded condition False for every replica of a host whose node pod stops (its
agent got SIGTERM, the pod deleted): its host leaves the model's Service unless it holds the
model's last replica served, while Triton still answers."""


TRITON_UNAVAILABLE_REASON = "TritonUnavailable"
"""The reason of a loaded condition False while the node's Triton does not answer (it exited,
or restarts)."""
NOT_LOADED_REASON = "ModelNotLoaded"
"""The reason of a loaded condition False for a model installed but not loaded (a host's replica:
after it was READY there, as while a restarted Triton loads it again)."""
RESTORING_REASONS = frozenset({NODE_STOPPING_REASON, TRITON_UNAVAILABLE_REASON, NOT_LOADED_REASON})
"""A host's replica False for one of these is expected back on its node (or, stopping, still
answers): a model's last served replica keeps its host in the Service meanwhile, where the node
gateway holds its requests until the model is back (`proxy.gateway.restore`)."""


LOAD_FAILED_REASON = "ModelLoadFailed"
"""A host's loader failed to load a replica for a cause it does not name below."""
HOST_MEMORY_REASON = "InsufficientHostMemory"
"""The agent refused a load that would take Triton past its host memory or its namespace past
its share of it: the agent's Event reason, and its loader's for the replica."""
HOST_MEMORY_WORDS = "Triton's host memory"
"""Words every such refusal of the agent carries, by which a loader tells it from a GPU's."""
LOAD_FAILURE_REASONS = frozenset(
    {"FetchFailed", "ModelInvalid", "ModelRejected", "LoadRefused", "LoadTimedOut"}
    | {HOST_MEMORY_REASON, LOAD_FAILED_REASON}
)
"""The reasons a host's loader reports to the agent (ListHosted) for a replica it cannot load:
its files cannot be fetched (FetchFailed: the store's answer, a credential), are invalid
(ModelInvalid: the loader's checks, such as a config.pbtxt naming another model, the agent's, or
Triton refusing them, with Triton's message), are refused by the agent or do not fit
(ModelRejected; Triton's host memory has its own reason), or the load timed out. The agent writes
them on the replica's loaded condition; any other reason reads LOAD_FAILED_REASON."""
LOAD_FAILURE_MESSAGE_CHARS = 400
"""The most of a loader's failure message the agent keeps (and the loader sends)."""
LOAD_FAILURE_REPORT_CHARS = 32_000
"""The most message characters one ListHosted reports in all (the agent reads at most 64 KiB of
it): the replicas past it are reported once others load."""


def load_failure(reason: str, message: str) -> tuple[str, str]:
    """A loader's reported failure as the agent keeps it: a known reason, the message on one
    line and bounded."""
    text = " ".join(message.split())
    if len(text) > LOAD_FAILURE_MESSAGE_CHARS:
        text = text[: LOAD_FAILURE_MESSAGE_CHARS - 3] + "..."
    return (reason if reason in LOAD_FAILURE_REASONS else LOAD_FAILED_REASON), text


def replica_uid(model_uid: str, replica: int) -> str:
    """A replica's uid in proofs and ledgers: no pod's uid has a slash."""
    return f"{model_uid}/{replica}"


def replica_name(model: str, replica: int) -> str:
    """A replica's name in proofs: no pod's name has a slash."""
    return f"{model}/{replica}"


@dataclass(frozen=True, slots=True)
class HostedReplica:
    """One replica a host serves, as the binder placed it."""

    model: str
    """The TritonModel's name (its Service, labels and conditions are named after it)."""
    uid: str
    """The TritonModel's uid."""
    replica: int
    """The ordinal: the replica's identity (a roll's surge replica takes a new one)."""
    gpu: str
    """The UUID of the GPU it is placed on."""
    residency: str
    """`always` or `on-demand`, as placed (the proof binds it)."""
    proof: str
    """The binder's proof of placement (`common.proofs`) for the replica's claim."""
    storage_uri: str = ""
    """Where its files are (the TritonModel's spec.storageUri)."""
    concurrency: int = 0
    """The TritonModel's spec.maxConcurrency: requests in flight per replica (0: the proxy's
    default); more wait in the model's queue."""
    idle_seconds: int = 0
    """The TritonModel's spec.idleSeconds (on-demand): idle time before it may be unloaded (0:
    the proxy's default)."""
    draining: bool = False
    """Leaving the host: no new request is sent to it; unloaded once in-flight ones finish."""
    storage_secret: str = ""
    """The TritonModel's spec.storageSecret: the Secret of the host's namespace, mounted in
    the host's loader alone, whose credential it fetches with ("": none)."""
    storage_options: tuple[tuple[str, str], ...] = ()
    """The TritonModel's s3-* and schema-path annotations
    (`common.storage.read_storage_options`)."""
    model_id: str = ""
    """The model id its clients send (spec.modelName, which the proof binds); "" reads as
    `model`, the TritonModel's name."""
    idempotent: bool | None = None
    """The TritonModel's spec.idempotent: true, its calls may run twice, so the host's proxy sends
    again one lost with the node gateway's process; false, never; None (unset): as the model's
    config in Triton says (`common.modelconfig.calls_may_run_twice`)."""

    def __post_init__(self) -> None:
        if not self.model_id:
            object.__setattr__(self, "model_id", self.model)

    @property
    def replica_uid(self) -> str:
        return replica_uid(self.uid, self.replica)

    @property
    def replica_name(self) -> str:
        return replica_name(self.model, self.replica)

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "model": self.model,
            "uid": self.uid,
            "replica": self.replica,
            "gpu": self.gpu,
            "residency": self.residency,
            "proof": self.proof,
        }
        if self.storage_uri:
            out["storageUri"] = self.storage_uri
        if self.concurrency:
            out["maxConcurrency"] = self.concurrency
        if self.idle_seconds:
            out["idleSeconds"] = self.idle_seconds
        if self.idempotent is not None:
            out["idempotent"] = self.idempotent
        if self.draining:
            out["draining"] = True
        if self.storage_secret:
            out["storageSecret"] = self.storage_secret
        if self.storage_options:
            out["storageOptions"] = dict(self.storage_options)
        if self.model_id != self.model:
            out["modelId"] = self.model_id
        return out


def encode_hosted(replicas: Iterable[HostedReplica]) -> str:
    """The annotation's value for `replicas`, in a stable order (model, replica)."""
    ordered = sorted(replicas, key=lambda r: (r.model, r.replica))
    return json.dumps([r.to_json() for r in ordered], separators=(",", ":"))


def decode_hosted(value: str) -> list[HostedReplica]:
    """The replicas of an annotation's value; HostedError saying what is wrong when it is not a
    list of replicas (an empty or missing value is an empty list)."""
    if not value.strip():
        return []
    try:
        data = json.loads(value)
    except ValueError as e:
        raise HostedError(f"the hosted-models annotation is not JSON ({e})") from e
    if not isinstance(data, list):
        raise HostedError("the hosted-models annotation is not a JSON list")
    replicas = []
    for number, entry in enumerate(data, 1):
        if not isinstance(entry, dict):
            raise HostedError(f"entry {number} of the hosted-models annotation is not an object")
        try:
            replicas.append(_replica(entry))
        except (KeyError, TypeError, ValueError) as e:
            raise HostedError(
                f"entry {number} of the hosted-models annotation is malformed: {e}"
            ) from e
    return replicas


def serving_fields(entry: Mapping[str, object]) -> tuple[int, int, str, bool | None]:
    """A model's `maxConcurrency` and `idleSeconds` (whole numbers of 0 or more; 0: the proxy's
    flag), `residency` (a class) and `idempotent` (true, false, or None: unset), as both lists of
    a host give them (this annotation's entries, and the models file its loader writes for its
    proxy: proxy/table.py); ValueError saying which is wrong."""
    numbers = []
    for key in ("maxConcurrency", "idleSeconds"):
        value = entry.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"`{key}` {value!r} is not a whole number of 0 or more")
        numbers.append(value)
    residency = entry.get("residency", RESIDENCY_ALWAYS)
    if not isinstance(residency, str) or residency not in RESIDENCIES:
        raise ValueError(f"`residency` {residency!r} is not one of {', '.join(RESIDENCIES)}")
    idempotent = entry.get("idempotent")
    if idempotent is not None and not isinstance(idempotent, bool):
        raise ValueError(f"`idempotent` {idempotent!r} is not true or false")
    return numbers[0], numbers[1], residency, idempotent


def _replica(entry: dict[str, object]) -> HostedReplica:
    def text(key: str, default: str | None = None) -> str:
        value = entry.get(key, default)
        if not isinstance(value, str):
            raise TypeError(f"`{key}` is not a string")
        return value

    ordinal = entry.get("replica")
    if isinstance(ordinal, bool) or not isinstance(ordinal, int) or ordinal < 0:
        raise ValueError("`replica` is not a whole number of 0 or more")
    concurrency, idle_seconds, residency, idempotent = serving_fields(entry)
    draining = entry.get("draining", False)
    if not isinstance(draining, bool):
        raise TypeError("`draining` is not true or false")
    secret = text("storageSecret", "")
    if secret and not SECRET_NAME.fullmatch(secret):
        raise ValueError(f"`storageSecret` {secret!r} is not a Secret name")
    options = entry.get("storageOptions", {})
    if not isinstance(options, dict):
        raise TypeError("`storageOptions` is not an object")
    uri = text("storageUri", "")
    # Checked as s3:// settings whatever the replica's URI: a roll's replicas on earlier files
    # carry the model's settings of now, which the loader applies to s3:// alone.
    s3_options = read_storage_options(options, "", "s3")
    model = text("model")
    return HostedReplica(
        model=model,
        model_id=validate_model_id(text("modelId", model)),
        uid=text("uid"),
        replica=ordinal,
        gpu=text("gpu", ""),
        residency=residency,
        proof=text("proof", ""),
        storage_uri=uri,
        concurrency=concurrency,
        idle_seconds=idle_seconds,
        idempotent=idempotent,
        draining=draining,
        storage_secret=secret,
        storage_options=s3_options,
    )
