"""A model's `config.pbtxt` as the agent needs it: the backend check and the load-time override.

Triton accepts a `config` parameter on `POST /v2/repository/models/<name>/load`: a JSON ModelConfig
that replaces `config.pbtxt` for that load. The agent uses it to pin every instance group to the
GPU the binder chose (`KIND_GPU`, `gpus: [cuda index]`), or to the CPU on machines without GPUs.
Parsing and the name check are shared with the loader (`common.modelconfig`); this module turns
their error into the agent's. `ModelPolicy` decides what a tenant's config may ask of the shared
Triton: nothing that names host paths or devices beyond the placement, no ensembles or repository
agents, ONNX external data outside the model, and tenant code (python and custom backends, the
framework backends whose graphs read files, backend libraries shipped with the model, custom op
libraries) only for the namespaces the operator allows, and nothing that makes Triton itself
hold unbounded memory at load (instances, warmup samples, initial sequence states:
`load_problems`), counted once for each version directory the config's version_policy selects,
of at most `max_versions` directories. The override also bounds how long the model's batchers
keep a request or a sequence (`queue_bounded`), which an unload waits for. Pure: it reads the
text it is given and returns strings; the files are `agent.installs.repository`'s.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2

from agent.errors import InvalidRequestError, TenantCodeNotAllowedError
from common.backends import runs_in_own_process
from common.modelconfig import ModelConfig, ModelConfigError, parse_model_config

_RENAME = "Triton would refuse to load it: make them equal"


def parse_config(text: str, model_id: str) -> ModelConfig:
    """Parse `config.pbtxt` text; its `name`, when set, must equal the model id."""
    try:
        config = parse_model_config(text, model_id)
    except ModelConfigError as e:
        fix = f"model {model_id!r} cannot be installed until it is fixed"
        raise InvalidRequestError(e.advised(wrong_name=_RENAME, invalid=fix)) from e
    if not config.backend and not config.platform:
        raise InvalidRequestError(
            f"config.pbtxt of model {model_id!r} sets neither 'backend' nor 'platform'; "
            f'Triton cannot tell how to run it without one (for example backend: "python")'
        )
    return config


def pinned_config(config: ModelConfig, model_id: str, gpu_index: int | None) -> ModelConfig:
    """A copy whose instance groups run on GPU `gpu_index`, or on the CPU when it is None.

    A config without instance groups gets one group of one instance, as Triton's default would
    place one per visible GPU, which is exactly what sharing must prevent.
    """
    pinned = model_config_pb2.ModelConfig()
    pinned.CopyFrom(config)
    pinned.name = model_id
    if not pinned.instance_group:
        pinned.instance_group.add(count=1)
    kind = (
        model_config_pb2.ModelInstanceGroup.KIND_CPU
        if gpu_index is None
        else model_config_pb2.ModelInstanceGroup.KIND_GPU
    )
    for group in pinned.instance_group:
        group.kind = kind
        del group.gpus[:]
        if gpu_index is not None:
            group.gpus.append(gpu_index)
        if group.count < 1:
            group.count = 1
    return pinned


ORT_ARENA = "enable_mem_arena"
ORT_ARENA_SHRINKAGE = "memory.enable_memory_arena_shrinkage"


def arena_released(config: ModelConfig) -> ModelConfig:
    """A copy whose ONNX Runtime session keeps no CPU memory arena (`enable_mem_arena` "0", any
    `memory.enable_memory_arena_shrinkage` removed: it names an arena, and would fail every
    request without one); other backends' configs unchanged. ONNX Runtime's arena grows to a
    request's peak inside Triton's own process and keeps it, where no model can be billed for it
    (`agent.models.tritonram`): without it, what a request allocates is freed when it ends."""
    if backend_of(config) != "onnxruntime":
        return config
    released = model_config_pb2.ModelConfig()
    released.CopyFrom(config)
    released.parameters[ORT_ARENA].string_value = "0"
    if ORT_ARENA_SHRINKAGE in released.parameters:
        del released.parameters[ORT_ARENA_SHRINKAGE]
    return released


def queue_bounded(config: ModelConfig, most_us: int) -> tuple[ModelConfig, list[str]]:
    """A copy whose batchers keep a request or a sequence at most `most_us` microseconds, and
    what was lowered ("field: asked -> loaded with", empty when nothing). Triton's unload of a
    model waits for the requests its batchers hold (a dynamic batcher holds a lone request for
    its whole `max_queue_delay_microseconds`), so a tenant's config could otherwise keep an
    unload, its GPU's queue and its memory for as long as it asks. Bounded: the dynamic
    batcher's and the sequence batcher's strategies' `max_queue_delay_microseconds`, the
    sequence batcher's `max_sequence_idle_microseconds` (0 reads as Triton's default, 1 s), and
    each queue policy's `default_timeout_microseconds` (0, no timeout, is kept: a request then
    waits only for its batch)."""
    bounded = model_config_pb2.ModelConfig()
    bounded.CopyFrom(config)
    lowered: list[str] = []

    def bound(message: Any, field: str, where: str, default: int = 0) -> None:
        asked = getattr(message, field) or default
        if asked > most_us:
            setattr(message, field, most_us)
            lowered.append(f"{where}.{field}: {asked} -> {most_us}")

    if bounded.HasField("dynamic_batching"):
        batching = bounded.dynamic_batching
        bound(batching, "max_queue_delay_microseconds", "dynamic_batching")
        if batching.HasField("default_queue_policy"):
            policy = batching.default_queue_policy
            bound(policy, "default_timeout_microseconds", "dynamic_batching.default_queue_policy")
        for level in sorted(batching.priority_queue_policy):
            where = f"dynamic_batching.priority_queue_policy[{level}]"
            bound(batching.priority_queue_policy[level], "default_timeout_microseconds", where)
    if bounded.HasField("sequence_batching"):
        sequences = bounded.sequence_batching
        idle = TRITON_SEQUENCE_IDLE_MICROSECONDS
        bound(sequences, "max_sequence_idle_microseconds", "sequence_batching", idle)
        strategy = sequences.WhichOneof("strategy_choice")
        if strategy is not None:
            where = f"sequence_batching.{strategy}"
            bound(getattr(sequences, strategy), "max_queue_delay_microseconds", where)
    return bounded, lowered


def pinned_as(config: dict[str, Any], gpu_index: int | None) -> bool:
    """True when a model config as Triton reports it (JSON) runs every instance where
    `pinned_config` would: on GPU `gpu_index`, or on the CPU when it is None."""
    groups = config.get("instance_group")
    if not isinstance(groups, list) or not groups:
        return False
    kind = "KIND_CPU" if gpu_index is None else "KIND_GPU"
    gpus = [] if gpu_index is None else [gpu_index]
    return all(
        isinstance(g, dict) and g.get("kind") == kind and list(g.get("gpus") or []) == gpus
        for g in groups
    )


def override_json(config: ModelConfig) -> str:
    """The JSON string Triton's load `config` parameter takes."""
    return json_format.MessageToJson(
        config, preserving_proto_field_name=True, indent=None, sort_keys=True
    )


# Backends whose models are data that cannot reach beyond the model, as far as the agent can
# check (docs/agent.md, "Which backends are safe"): an ONNX graph has no file or process
# operations and its external data must be files of the model (`external_data_problem`); a
# TensorRT plan runs no host code unless the operator turns on version compatibility.
DEFAULT_SAFE_BACKENDS = ("onnxruntime", "tensorrt")
# Framework backends off the default list, and why: their graphs read files Triton can read.
READS_FILES = {
    "pytorch": "TorchScript can call torch.from_file and every registered torch.ops operator",
    "tensorflow": "TensorFlow graphs can run ReadFile, MatchingFiles and WriteFile on any path",
    "openvino": "OpenVINO models can load extension libraries and ONNX external data anywhere",
}
ONNX_BACKENDS = frozenset({"onnxruntime", "openvino"})
"""Backends that open `.onnx` files, and the external data those name."""
# Triton's platform names, as the backend that serves each.
PLATFORM_BACKENDS = {
    "tensorrt_plan": "tensorrt",
    "onnxruntime_onnx": "onnxruntime",
    "pytorch_libtorch": "pytorch",
    "tensorflow_graphdef": "tensorflow",
    "tensorflow_savedmodel": "tensorflow",
}
_BACKEND_NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
# Triton looks for a backend's library in the model's own directories before its backend
# directory: a model that ships one runs its own code whatever `backend` it names.
_BACKEND_LIBRARY_RE = re.compile(r"(^|/)libtriton_[^/]*$")


DEFAULT_MAX_INSTANCES: Final = 16
DEFAULT_MAX_LOAD_DATA_BYTES: Final = 64 * 1024**2
MAX_WARMUP_RUNS: Final = 64
"""Warmup executions one load may ask of Triton (each sample's `count`, at least 1, summed): a
load holds its GPU's queue of loads and unloads, and Triton's HTTP slows while it runs."""
DEFAULT_MAX_THREADS: Final = 64
DEFAULT_MAX_VERSIONS: Final = 4
"""Version directories one model may have: Triton loads every version its version_policy
selects, each with all of the config's instances and warmup runs."""
DEFAULT_MAX_QUEUE_SECONDS: Final = 1.0
"""The longest a model's batcher may keep a request or an idle sequence (`queue_bounded`)."""
TRITON_SEQUENCE_IDLE_MICROSECONDS: Final = 1_000_000
"""Triton's `max_sequence_idle_microseconds` when a config leaves it 0."""
# Triton reads a version directory's name with std::stoll: leading blanks, a sign and any
# trailing text are accepted ("+1", " 1", "1b", "01" all read as version 1) and a number past
# int64 throws. Only the plain spelling is accepted, so every name is one version, counted once.
_NUMBER_LIKE_RE = re.compile(r"\s*[+-]?[0-9]")
_VERSION_RE = re.compile(r"0|[1-9][0-9]{0,17}")
_THREADS_RE = re.compile(r"thread", re.IGNORECASE)
"""A model parameter naming a thread count: onnxruntime's intra_op_thread_count and
inter_op_thread_count, PyTorch's INTRA_OP_THREAD_COUNT and INTER_OP_THREAD_COUNT, OpenVINO's
INFERENCE_NUM_THREADS and COMPILATION_NUM_THREADS. Each instance's session starts that many."""
# Bytes per element Triton gives each data type in a warmup request; a string element is at least
# its 4-byte length (zero_data strings are empty).
_ELEMENT_BYTES: Final = {
    model_config_pb2.TYPE_BOOL: 1,
    model_config_pb2.TYPE_UINT8: 1,
    model_config_pb2.TYPE_INT8: 1,
    model_config_pb2.TYPE_UINT16: 2,
    model_config_pb2.TYPE_INT16: 2,
    model_config_pb2.TYPE_FP16: 2,
    model_config_pb2.TYPE_BF16: 2,
    model_config_pb2.TYPE_UINT32: 4,
    model_config_pb2.TYPE_INT32: 4,
    model_config_pb2.TYPE_FP32: 4,
    model_config_pb2.TYPE_STRING: 4,
    model_config_pb2.TYPE_UINT64: 8,
    model_config_pb2.TYPE_INT64: 8,
    model_config_pb2.TYPE_FP64: 8,
}


def instance_count(config: ModelConfig) -> int:
    """The instances Triton creates for the model on its GPU (or the CPU) once pinned."""
    return sum(max(group.count, 1) for group in config.instance_group) or 1


def version_directories(names: Iterable[str], model_id: str, most: int) -> list[int]:
    """The versions Triton finds among `names`, the model directory's subdirectories, ascending;
    InvalidRequestError for a name Triton would read as a number other than plainly, or for more
    than `most` of them (every version selected is loaded with all its instances)."""
    versions = []
    for name in sorted(set(names)):
        if _VERSION_RE.fullmatch(name):
            versions.append(int(name))
        elif _NUMBER_LIKE_RE.match(name):
            raise InvalidRequestError(
                f"model {model_id!r} has a directory {name!r}, which Triton would read as a "
                f"version number; name version directories plainly (1, 2, ...) and other "
                f"directories with a name that does not start with a digit"
            )
    if len(versions) > most:
        raise InvalidRequestError(
            f"model {model_id!r} has {len(versions)} version directories, over this node's "
            f"{most} per model (--max-model-versions); ship only the versions it serves"
        )
    return sorted(versions)


def selected_versions(config: ModelConfig, versions: Iterable[int]) -> int:
    """How many of the version directories present Triton loads under the config's
    version_policy (latest 1 when it sets none); at least 1, as a load of none fails anyway."""
    present = set(versions)
    policy = config.version_policy
    which = policy.WhichOneof("policy_choice")
    if which == "all":
        count = len(present)
    elif which == "specific":
        count = len(present & set(policy.specific.versions))
    else:
        wanted = policy.latest.num_versions if which == "latest" else 1
        count = min(wanted, len(present))
    return max(count, 1)


def top_directories(paths: Iterable[str]) -> set[str]:
    """The model directory's subdirectories that files under `paths` lie in."""
    return {path.split("/", 1)[0] for path in paths if "/" in path}


def _data_bytes(data_type: int, dims: Iterable[int], batch: int = 1) -> int:
    elements = 1
    for dim in dims:
        elements *= max(dim, 1)  # a variable dimension: Triton refuses it here
    return elements * _ELEMENT_BYTES.get(data_type, 8) * max(batch, 1)


def load_data_bytes(config: ModelConfig) -> int:
    """What Triton allocates for the model's data when it loads it, at most: every warmup
    sample's data (Triton generates them all before the first run, zero or random data or a
    file's bytes, per request, and the backend gathers each batch, so every input counts times
    its batch size) and every initial sequence state (held as long as the model is loaded)."""
    total = 0
    for sample in config.model_warmup:
        for data in sample.inputs.values():
            total += _data_bytes(data.data_type, data.dims, sample.batch_size)
    for state in config.sequence_batching.state:
        for initial in state.initial_state:
            total += _data_bytes(initial.data_type, initial.dims)
    return total


def load_data_files(config: ModelConfig) -> list[str]:
    """The model's files Triton reads whole when it loads it: warmup samples' data (under
    `warmup/`) and initial sequence states (under `initial_state/`)."""
    files = {
        f"warmup/{data.input_data_file}"
        for sample in config.model_warmup
        for data in sample.inputs.values()
        if data.input_data_file
    }
    files.update(
        f"initial_state/{initial.data_file}"
        for state in config.sequence_batching.state
        for initial in state.initial_state
        if initial.data_file
    )
    return sorted(files)


@dataclass(frozen=True)
class ModelPolicy:
    """What a tenant's model may ask of the shared Triton."""

    safe_backends: frozenset[str] = frozenset(DEFAULT_SAFE_BACKENDS)
    """Backends that run no tenant code; any other runs tenant code inside Triton."""
    tenant_code_namespaces: frozenset[str] = frozenset()
    """Namespaces whose models may run their own code in Triton (python, custom backends)."""
    max_instances: int = DEFAULT_MAX_INSTANCES
    """Instances one model may ask Triton for (`--max-model-instances`)."""
    max_load_data_bytes: int = DEFAULT_MAX_LOAD_DATA_BYTES
    """Bytes of data one model's config may make Triton allocate when it loads it: warmup
    samples and initial sequence states (`--max-load-data-bytes`)."""
    max_threads: int = DEFAULT_MAX_THREADS
    """Most threads any one thread-count parameter of a model may ask its backend for, per
    instance (`--max-model-threads`; 0: no bound)."""
    max_versions: int = DEFAULT_MAX_VERSIONS
    """Version directories one model may have (`--max-model-versions`)."""
    max_queue_microseconds: int = int(DEFAULT_MAX_QUEUE_SECONDS * 1_000_000)
    """The longest a model's batchers may keep a request or an idle sequence; a config asking
    more is loaded with this (`queue_bounded`, `--max-model-queue-seconds`)."""

    def tenant_code_allowed(self, namespace: str) -> bool:
        return namespace in self.tenant_code_namespaces

    def versions(self, model_id: str, directories: Iterable[str]) -> list[int]:
        """The model's versions among its subdirectories, within `max_versions`."""
        return version_directories(directories, model_id, self.max_versions)

    def check_files(self, model_id: str, paths: list[str], namespace: str) -> None:
        """Refuse a manifest with more version directories than the node allows, or that ships
        a Triton backend library unless `namespace` may run its own code."""
        self.versions(model_id, top_directories(paths))
        if self.tenant_code_allowed(namespace):
            return
        for path in paths:
            if _BACKEND_LIBRARY_RE.search(path):
                raise TenantCodeNotAllowedError(
                    f"model {model_id!r} ships {path!r}, a Triton backend library that Triton "
                    f"would load in place of its own; namespace {namespace!r} may not run its own "
                    f"code in the shared Triton (the operator allows it per namespace)",
                    event_reason="TenantCodeNotAllowed",
                )

    def check_config(
        self, config: ModelConfig, model_id: str, namespace: str, versions: Iterable[int]
    ) -> None:
        """Refuse what the placement does not allow: devices, host paths, other models, more
        than the node's bounds for the `versions` present, and tenant code from a namespace not
        allowed to run it. The instance kind and GPUs are not checked: the agent replaces them
        with the placement's."""
        problems = _host_problems(config)
        if problems:
            raise InvalidRequestError(
                f"config.pbtxt of model {model_id!r} asks for what a shared Triton cannot give "
                f"one tenant: {'; '.join(problems)}; remove it (the agent pins the model to the "
                f"GPU the binder chose)"
            )
        problems = self.load_problems(config, selected_versions(config, versions))
        if problems:
            raise InvalidRequestError(
                f"config.pbtxt of model {model_id!r} asks the shared Triton for more than one "
                f"model may hold: {'; '.join(problems)}; ask for less, or ask the operator to "
                f"raise the limit"
            )
        code = _tenant_code(config, self.safe_backends)
        if code and not self.tenant_code_allowed(namespace):
            raise TenantCodeNotAllowedError(
                f"model {model_id!r} would run its own code inside the shared Triton "
                f"({'; '.join(code)}); namespace {namespace!r} is not allowed to (the operator "
                f"allows it per namespace with --tenant-code-namespaces); use one of the "
                f"backends {', '.join(sorted(self.safe_backends))} (PyTorch and TensorFlow "
                f"models export to ONNX), or ask the operator to allow the namespace",
                event_reason="TenantCodeNotAllowed",
            )

    def load_problems(self, config: ModelConfig, versions: int = 1) -> list[str]:
        """What loading the config would make Triton hold beyond this node's bounds: every
        instance is a session of the backend with its own copy of what it needs, and warmup
        data is allocated inside Triton before the model serves, whatever its backend. Triton
        does all of it once for each of the `versions` its version_policy selects."""
        problems = []
        times = f" ({versions} versions selected by version_policy)" if versions > 1 else ""
        instances = instance_count(config) * versions
        if instances > self.max_instances:
            problems.append(
                f"{instances} instances{times}, over this node's {self.max_instances} per model "
                f"(--max-model-instances)"
            )
        data = load_data_bytes(config) * versions
        if data > self.max_load_data_bytes:
            problems.append(
                f"{data} bytes of warmup samples (every input times its batch size) and initial "
                f"sequence states{times}, over this node's {self.max_load_data_bytes} "
                f"(--max-load-data-bytes)"
            )
        runs = sum(max(sample.count, 1) for sample in config.model_warmup) * versions
        if runs > MAX_WARMUP_RUNS:
            problems.append(f"{runs} warmup runs{times}, over {MAX_WARMUP_RUNS} per load")
        problems += thread_problems(config, self.max_threads)
        return problems

    def check_load_data_files(
        self, config: ModelConfig, model_id: str, sizes: dict[str, int]
    ) -> None:
        """Refuse warmup and initial-state data files that Triton would read whole past the
        load-data bound (`sizes`: the manifest's size of each file)."""
        for path in load_data_files(config):
            size = sizes.get(path, 0)
            if size > self.max_load_data_bytes:
                raise InvalidRequestError(
                    f"model {model_id!r} loads {path!r}, {size} bytes that Triton reads whole, "
                    f"over this node's {self.max_load_data_bytes} (--max-load-data-bytes); use "
                    f"a smaller sample or zero_data"
                )


def thread_problems(config: ModelConfig, most: int) -> list[str]:
    """Thread-count parameters past `most` (0: no bound) or that are not whole numbers: every
    instance's session starts that many threads inside the shared Triton."""
    problems = []
    for key, value in sorted(config.parameters.items()):
        if not _THREADS_RE.search(key):
            continue
        text = value.string_value.strip()
        if not text.isdigit():
            problems.append(f"parameters[{key!r}] {value.string_value!r} is not a thread count")
        elif most and int(text) > most:
            problems.append(
                f"parameters[{key!r}] asks for {int(text)} threads per instance, over this "
                f"node's {most} (--max-model-threads)"
            )
    return problems


def _is_host_path(value: str) -> bool:
    """True for a value naming a place outside the model's own directory."""
    text = value.strip()
    if text.startswith("$$TRITON_MODEL_DIRECTORY"):
        text = text.removeprefix("$$TRITON_MODEL_DIRECTORY").lstrip("/")
    elif text.startswith(("/", "~", "\\")) or re.match(r"[A-Za-z]:[\\/]", text):
        return True
    return any(part == ".." for part in re.split(r"[\\/]", text))


def _plain_file_name(value: str) -> bool:
    return (
        value in ("", value.strip())
        and "/" not in value
        and "\\" not in value
        and (value not in (".", ".."))
    )


def _host_problems(config: ModelConfig) -> list[str]:
    problems = []
    for group in config.instance_group:
        label = f"instance group {group.name or '(unnamed)'}"
        if group.secondary_devices:
            problems.append(f"{label} sets secondary_devices")
        if group.host_policy:
            problems.append(f"{label} sets host_policy {group.host_policy!r}")
    if config.model_repository_agents.agents:
        problems.append("model_repository_agents runs repository agents on the node")
    if config.HasField("ensemble_scheduling") or config.platform == "ensemble":
        problems.append("an ensemble calls other models on the node")
    if not _plain_file_name(config.default_model_filename):
        problems.append(f"default_model_filename {config.default_model_filename!r} is a path")
    for key, name in config.cc_model_filenames.items():
        if not _plain_file_name(name):
            problems.append(f"cc_model_filenames[{key!r}] {name!r} is a path")
    for warmup in config.model_warmup:
        for name, data in warmup.inputs.items():
            if data.input_data_file and not _plain_file_name(data.input_data_file):
                problems.append(f"model_warmup input {name!r} reads {data.input_data_file!r}")
    named = [(f"parameters[{k!r}]", v.string_value) for k, v in config.parameters.items()]
    accelerators = config.optimization.execution_accelerators
    for accelerator in [
        *accelerators.gpu_execution_accelerator,
        *accelerators.cpu_execution_accelerator,
    ]:
        named += [
            (f"execution accelerator {accelerator.name!r} parameter {k!r}", v)
            for k, v in accelerator.parameters.items()
        ]
    problems += [
        f"{where} names a host path ({value!r})" for where, value in named if _is_host_path(value)
    ]
    return problems


def backend_of(config: ModelConfig) -> str:
    """The backend that serves the model (a platform, as its backend's name)."""
    return str(config.backend or PLATFORM_BACKENDS.get(config.platform, config.platform))


def check_declared_backend(config: ModelConfig, model_id: str, declared: str) -> None:
    """Refuse a model that runs in a process of its own (its own CUDA context) when its pod
    declared an in-process backend: the binder booked no per-process allowance for it, so it
    would hold more than its placement booked (`common.backends`)."""
    if runs_in_own_process(backend_of(config), config.runtime) and not runs_in_own_process(
        declared
    ):
        raise InvalidRequestError(
            f"model {model_id!r} runs in a process of its own (backend "
            f"{backend_of(config)!r}{', runtime ' + repr(config.runtime) if config.runtime else ''}"
            f"), with a CUDA context its request does not hold, but its pod declares backend "
            f"{declared!r}, so the binder booked no per-process allowance for it; correct or "
            f"remove the pod's backend annotation and recreate the pod"
        )


def onnx_files(config: ModelConfig, paths: list[str]) -> list[str]:
    """The model's files its backend may open as ONNX models (none for other backends)."""
    if backend_of(config) not in ONNX_BACKENDS:
        return []
    name = config.default_model_filename or "model.onnx"
    return [p for p in paths if p.endswith(".onnx") or p.rsplit("/", 1)[-1] == name]


def external_data_problem(model_id: str, model_file: str, location: str, files: set[str]) -> str:
    """Why `location`, named by `model_file`'s tensors, may not be read ("" when it is a file
    of the model): onnxruntime opens it relative to the model file, wherever it leads."""
    parts = location.split("/")
    target = posixpath.normpath(posixpath.join(posixpath.dirname(model_file), location))
    if (
        location
        and not location.startswith("/")
        and "\\" not in location
        and "\0" not in location
        and ".." not in parts
        and target in files
    ):
        return ""
    return (
        f"{model_file} of model {model_id!r} keeps tensor data in {location!r}, which is not a "
        f"file of the model: onnxruntime would read it from the node, wherever it leads; save "
        f"the external data beside the model file (onnx.save_model(..., location=<file name>)) "
        f"and install it with the model"
    )


def _tenant_code(config: ModelConfig, safe_backends: frozenset[str]) -> list[str]:
    """Why the model would run the tenant's own code in Triton; empty when it would not."""
    reasons = []
    backend = backend_of(config)
    if not _BACKEND_NAME_RE.fullmatch(backend):
        reasons.append(f"backend {backend!r} is not a backend name")
    elif backend not in safe_backends and backend in READS_FILES:
        reasons.append(f"backend {backend!r} runs graphs that read files ({READS_FILES[backend]})")
    elif backend not in safe_backends:
        reasons.append(f"backend {backend!r} runs the model's own code")
    if (
        config.platform
        and config.platform not in PLATFORM_BACKENDS
        and config.platform != "ensemble"
    ):
        reasons.append(f"platform {config.platform!r} is not a framework platform")
    if config.runtime:
        reasons.append(f"runtime {config.runtime!r} replaces the backend's own library")
    if config.model_operations.op_library_filename:
        reasons.append("model_operations loads custom operation libraries")
    return reasons
