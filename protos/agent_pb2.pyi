from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ModelState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MODEL_STATE_UNSPECIFIED: _ClassVar[ModelState]
    MODEL_STATE_ABSENT: _ClassVar[ModelState]
    MODEL_STATE_INSTALLED: _ClassVar[ModelState]
    MODEL_STATE_LOADING: _ClassVar[ModelState]
    MODEL_STATE_READY: _ClassVar[ModelState]
    MODEL_STATE_UNLOADING: _ClassVar[ModelState]
    MODEL_STATE_FAILED: _ClassVar[ModelState]
MODEL_STATE_UNSPECIFIED: ModelState
MODEL_STATE_ABSENT: ModelState
MODEL_STATE_INSTALLED: ModelState
MODEL_STATE_LOADING: ModelState
MODEL_STATE_READY: ModelState
MODEL_STATE_UNLOADING: ModelState
MODEL_STATE_FAILED: ModelState

class FileEntry(_message.Message):
    __slots__ = ("path", "size", "sha256")
    PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    path: str
    size: int
    sha256: str
    def __init__(self, path: _Optional[str] = ..., size: _Optional[int] = ..., sha256: _Optional[str] = ...) -> None: ...

class Manifest(_message.Message):
    __slots__ = ("files",)
    FILES_FIELD_NUMBER: _ClassVar[int]
    files: _containers.RepeatedCompositeFieldContainer[FileEntry]
    def __init__(self, files: _Optional[_Iterable[_Union[FileEntry, _Mapping]]] = ...) -> None: ...

class InstallHeader(_message.Message):
    __slots__ = ("model_id", "manifest", "replica")
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    model_id: str
    manifest: Manifest
    replica: int
    def __init__(self, model_id: _Optional[str] = ..., manifest: _Optional[_Union[Manifest, _Mapping]] = ..., replica: _Optional[int] = ...) -> None: ...

class FileChunk(_message.Message):
    __slots__ = ("path", "offset", "data")
    PATH_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    path: str
    offset: int
    data: bytes
    def __init__(self, path: _Optional[str] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class InstallModelRequest(_message.Message):
    __slots__ = ("header", "chunk")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    header: InstallHeader
    chunk: FileChunk
    def __init__(self, header: _Optional[_Union[InstallHeader, _Mapping]] = ..., chunk: _Optional[_Union[FileChunk, _Mapping]] = ...) -> None: ...

class InstallModelResponse(_message.Message):
    __slots__ = ("model_id", "manifest_digest", "unchanged", "bytes_written", "kept")
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_DIGEST_FIELD_NUMBER: _ClassVar[int]
    UNCHANGED_FIELD_NUMBER: _ClassVar[int]
    BYTES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    KEPT_FIELD_NUMBER: _ClassVar[int]
    model_id: str
    manifest_digest: str
    unchanged: bool
    bytes_written: int
    kept: bool
    def __init__(self, model_id: _Optional[str] = ..., manifest_digest: _Optional[str] = ..., unchanged: _Optional[bool] = ..., bytes_written: _Optional[int] = ..., kept: _Optional[bool] = ...) -> None: ...

class ModelStatus(_message.Message):
    __slots__ = ("model_id", "state", "reason", "manifest_digest", "gpu_uuid", "gpu_index", "pod", "triton_name", "residency", "sleeping")
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_DIGEST_FIELD_NUMBER: _ClassVar[int]
    GPU_UUID_FIELD_NUMBER: _ClassVar[int]
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    POD_FIELD_NUMBER: _ClassVar[int]
    TRITON_NAME_FIELD_NUMBER: _ClassVar[int]
    RESIDENCY_FIELD_NUMBER: _ClassVar[int]
    SLEEPING_FIELD_NUMBER: _ClassVar[int]
    model_id: str
    state: ModelState
    reason: str
    manifest_digest: str
    gpu_uuid: str
    gpu_index: int
    pod: str
    triton_name: str
    residency: str
    sleeping: bool
    def __init__(self, model_id: _Optional[str] = ..., state: _Optional[_Union[ModelState, str]] = ..., reason: _Optional[str] = ..., manifest_digest: _Optional[str] = ..., gpu_uuid: _Optional[str] = ..., gpu_index: _Optional[int] = ..., pod: _Optional[str] = ..., triton_name: _Optional[str] = ..., residency: _Optional[str] = ..., sleeping: _Optional[bool] = ...) -> None: ...

class LoadModelRequest(_message.Message):
    __slots__ = ("model_id", "replica")
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    model_id: str
    replica: int
    def __init__(self, model_id: _Optional[str] = ..., replica: _Optional[int] = ...) -> None: ...

class UnloadModelRequest(_message.Message):
    __slots__ = ("model_id", "idle", "replica")
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    IDLE_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    model_id: str
    idle: bool
    replica: int
    def __init__(self, model_id: _Optional[str] = ..., idle: _Optional[bool] = ..., replica: _Optional[int] = ...) -> None: ...

class GetModelRequest(_message.Message):
    __slots__ = ("model_id", "replica")
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    model_id: str
    replica: int
    def __init__(self, model_id: _Optional[str] = ..., replica: _Optional[int] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelStatus]
    def __init__(self, models: _Optional[_Iterable[_Union[ModelStatus, _Mapping]]] = ...) -> None: ...

class ListGpusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Gpu(_message.Message):
    __slots__ = ("uuid", "index", "product", "memory_total_bytes", "memory_used_bytes", "healthy", "reason", "loaded_bytes", "sleeping_bytes")
    UUID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    PRODUCT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    LOADED_BYTES_FIELD_NUMBER: _ClassVar[int]
    SLEEPING_BYTES_FIELD_NUMBER: _ClassVar[int]
    uuid: str
    index: int
    product: str
    memory_total_bytes: int
    memory_used_bytes: int
    healthy: bool
    reason: str
    loaded_bytes: int
    sleeping_bytes: int
    def __init__(self, uuid: _Optional[str] = ..., index: _Optional[int] = ..., product: _Optional[str] = ..., memory_total_bytes: _Optional[int] = ..., memory_used_bytes: _Optional[int] = ..., healthy: _Optional[bool] = ..., reason: _Optional[str] = ..., loaded_bytes: _Optional[int] = ..., sleeping_bytes: _Optional[int] = ...) -> None: ...

class ListGpusResponse(_message.Message):
    __slots__ = ("node", "gpus")
    NODE_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    node: str
    gpus: _containers.RepeatedCompositeFieldContainer[Gpu]
    def __init__(self, node: _Optional[str] = ..., gpus: _Optional[_Iterable[_Union[Gpu, _Mapping]]] = ...) -> None: ...

class LoadFailure(_message.Message):
    __slots__ = ("model_id", "reason", "message", "replica")
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    model_id: str
    reason: str
    message: str
    replica: int
    def __init__(self, model_id: _Optional[str] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., replica: _Optional[int] = ...) -> None: ...

class ListHostedRequest(_message.Message):
    __slots__ = ("failures",)
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    failures: _containers.RepeatedCompositeFieldContainer[LoadFailure]
    def __init__(self, failures: _Optional[_Iterable[_Union[LoadFailure, _Mapping]]] = ...) -> None: ...

class HostedReplica(_message.Message):
    __slots__ = ("model_id", "replica", "storage_uri", "residency", "draining", "max_concurrency", "idle_seconds", "status", "storage_secret", "storage_options", "idempotent")
    class StorageOptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    STORAGE_URI_FIELD_NUMBER: _ClassVar[int]
    RESIDENCY_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    IDLE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STORAGE_SECRET_FIELD_NUMBER: _ClassVar[int]
    STORAGE_OPTIONS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENT_FIELD_NUMBER: _ClassVar[int]
    model_id: str
    replica: int
    storage_uri: str
    residency: str
    draining: bool
    max_concurrency: int
    idle_seconds: int
    status: ModelStatus
    storage_secret: str
    storage_options: _containers.ScalarMap[str, str]
    idempotent: bool
    def __init__(self, model_id: _Optional[str] = ..., replica: _Optional[int] = ..., storage_uri: _Optional[str] = ..., residency: _Optional[str] = ..., draining: _Optional[bool] = ..., max_concurrency: _Optional[int] = ..., idle_seconds: _Optional[int] = ..., status: _Optional[_Union[ModelStatus, _Mapping]] = ..., storage_secret: _Optional[str] = ..., storage_options: _Optional[_Mapping[str, str]] = ..., idempotent: _Optional[bool] = ...) -> None: ...

class ListHostedResponse(_message.Message):
    __slots__ = ("replicas", "refused", "parked", "node_stopping")
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    PARKED_FIELD_NUMBER: _ClassVar[int]
    NODE_STOPPING_FIELD_NUMBER: _ClassVar[int]
    replicas: _containers.RepeatedCompositeFieldContainer[HostedReplica]
    refused: _containers.RepeatedScalarFieldContainer[str]
    parked: _containers.RepeatedCompositeFieldContainer[HostedReplica]
    node_stopping: bool
    def __init__(self, replicas: _Optional[_Iterable[_Union[HostedReplica, _Mapping]]] = ..., refused: _Optional[_Iterable[str]] = ..., parked: _Optional[_Iterable[_Union[HostedReplica, _Mapping]]] = ..., node_stopping: _Optional[bool] = ...) -> None: ...

class CallerKeyRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CallerKeyResponse(_message.Message):
    __slots__ = ("key", "pod")
    KEY_FIELD_NUMBER: _ClassVar[int]
    POD_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    pod: str
    def __init__(self, key: _Optional[bytes] = ..., pod: _Optional[str] = ...) -> None: ...
