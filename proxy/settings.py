"""The proxy's settings: one frozen object whose fields each declare their flag, variable, default
and help once with common.settings (`DECLARATION` is derived from them), parsed once in
`__main__`.

Every flag has an environment variable `TRITONSHARE_<FLAG_UPPER>` (dashes become underscores);
a flag on the command line wins over the variable. Nothing here reads the environment at import.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from common.contract import (
    DEFAULT_PREFIX,
    DEFAULT_PROXY_GRPC_PORT,
    DEFAULT_PROXY_HTTP_PORT,
    DEFAULT_PROXY_METRICS_PORT,
    DEFAULT_SYSTEM_NAMESPACE,
    RESIDENCY_ALWAYS,
    RESIDENCY_ON_DEMAND,
)
from common.settings import (
    BadValueError,
    Declaration,
    address,
    boolean,
    declared,
    host_port,
    log_format_flag,
    log_level_flag,
    model_id,
    one_of,
    path,
    quantity,
    seconds,
    setting,
    text,
    whole,
)


class SettingsError(ValueError):
    """A flag or environment variable has a value the proxy cannot use."""


def ip_address(value: str) -> str:
    """An IP address as written (empty: none)."""
    if value:
        try:
            ipaddress.ip_address(value)
        except ValueError as e:
            raise BadValueError(
                "is not an IP address; write e.g. 10.0.0.7, or leave it empty"
            ) from e
    return value


def private_name(value: str) -> str:
    """A model's name in Triton (empty: the model id), by the model id's grammar."""
    return model_id(value) if value else value


# The relay's limits, declared once: the proxy and the node gateway (which runs the same relays
# for each calling pod) take them with the same flags, variables and defaults.


def listen_flag(endpoint: str, port: int) -> Any:
    """`--listen-<endpoint>` (http, grpc or metrics), on every address at `port` by default."""
    what = {"http": "REST", "grpc": "gRPC", "metrics": "metrics/health"}[endpoint]
    return setting(
        f"listen-{endpoint}", f"{what} listen address", address, default=f"0.0.0.0:{port}"
    )


def max_body() -> Any:
    return setting(
        "max-body",
        "largest body or message, a quantity such as 1Gi",
        quantity(minimum=1024),
        default="1Gi",
    )


def max_inflated() -> Any:
    return setting(
        "max-inflated",
        "largest size a compressed body or message may inflate to, a quantity such as 64Mi",
        quantity(minimum=1024),
        default="64Mi",
    )


def head_timeout() -> Any:
    return setting(
        "head-timeout",
        "seconds to send a REST request head or the gRPC preface",
        seconds(),
        default="30",
    )


def idle_timeout() -> Any:
    return setting(
        "idle-timeout",
        "seconds an idle tenant connection stays open, 0 = forever",
        seconds(),
        default="300",
    )


def connect_retry() -> Any:
    return setting(
        "connect-retry",
        "seconds a request that has not reached its upstream (the node gateway, or Triton) "
        "waits for it to listen again",
        seconds(),
        default="5",
    )


def finish_timeout() -> Any:
    return setting(
        "finish-timeout",
        "seconds to wait for in-flight requests at shutdown",
        seconds(),
        default="20",
    )


@declared
class Settings:
    """Everything the proxy needs to run; each field declared once with its flag."""

    triton_http_url: str = setting(
        "triton-http-url",
        "host:port REST requests go to: the node gateway's REST side (the host IP and its "
        "hostPort, 8010), the pods' only way to Triton",
        host_port,
        required="where Triton's HTTP endpoint is",
    )
    """host:port REST requests go to (no scheme): in a model pod the node gateway's REST side,
    which checks the caller and forwards to Triton on the node pod's loopback."""
    triton_grpc_url: str = setting(
        "triton-grpc-url",
        "host:port gRPC calls go to: the node gateway's gRPC side (the host IP and its hostPort, "
        "8011)",
        host_port,
        required="where Triton's gRPC endpoint is",
    )
    """host:port gRPC calls go to: in a model pod the node gateway's gRPC side."""
    model_id: str = setting(
        "model-id",
        "the pod's model id, as its clients name it: the only model requests may reach (a "
        "model pod; a model host passes --models-file instead)",
        private_name,
        default="",
    )
    """The pod's model id (its `tritonshare.io/model-id` annotation), the name clients send; the
    only model the proxy lets requests reach: a table of one. Its name in Triton is private
    (`triton_name`). Empty in a model host, whose models are in `models_file`."""
    models_file: Path | None = setting(
        "models-file",
        "a model host's table of models: a JSON list of objects with `model` and optionally "
        "`maxConcurrency`, `residency` and `idleSeconds` (written by the host's loader), followed "
        "as it changes",
        path,
        default=None,
    )
    """A model host's table: a JSON list of objects each with `model` (a public model id) and
    optionally `maxConcurrency` (its own limit; absent or 0: --container-concurrency),
    `residency` (`on-demand`: asleep after its `idleSeconds`, absent or 0: --idle-seconds, and
    woken by its next request, as with --residency on-demand); other keys are ignored. The
    host's loader writes it (`python -m loader --host`). Reread every --models-check-seconds
    when it changed: a model added is served, a model removed is drained (its new requests
    refused, those in flight finish within --finish-timeout) and then removed
    (proxy/table.py)."""
    models_check_seconds: float = setting(
        "models-check-seconds",
        "seconds between looks at whether --models-file changed",
        seconds(minimum=0.02),
        default="0.05",
    )
    """Seconds between two looks (a stat, reread only when it changed) at --models-file; default
    0.05: a replica the loader has made ready is served within it."""
    triton_name: str = setting(
        "triton-name",
        "the model's private name in Triton when not the model id (the node gateway's)",
        private_name,
        default="",
    )
    """The model's private name in Triton when it differs from `model_id`: requests
    naming `model_id` reach Triton under this name, and Triton's answers name `model_id` again.
    Empty: the same as `model_id`, and the relays rename nothing. The node gateway sets it for
    each calling pod from the caller table; a pod's own proxy leaves it empty (the gateway maps)."""
    source_address: str = setting(
        "source-address",
        "local address of connections to Triton or the node gateway (empty: the pod's own)",
        ip_address,
        default="",
    )
    """The local address connections to Triton (the node gateway) leave from; empty: the
    kernel's choice, which in a pod is the pod's address. The simulated cluster, whose pods share
    the host's network, sets each pod's own address here so the gateway can tell them apart."""
    listen_http: tuple[str, int] = listen_flag("http", DEFAULT_PROXY_HTTP_PORT)
    """host and port the tenant-facing KServe v2 REST endpoint listens on; default 0.0.0.0:9000."""
    listen_grpc: tuple[str, int] = listen_flag("grpc", DEFAULT_PROXY_GRPC_PORT)
    """host and port the tenant-facing gRPC endpoint listens on; default 0.0.0.0:9001."""
    listen_mesh_http: tuple[str, int] | None = setting(
        "listen-mesh-http",
        "a model host's REST address for the namespace's modelmesh-serving Service (8008)",
        address,
        default=None,
    )
    """With --models-file: where the host's proxy also serves KServe v2 REST for every model of
    its namespace, those of its table as on --listen-http and the routes file's relayed to their
    Services (`proxy.mesh`); None: not served."""
    listen_mesh_grpc: tuple[str, int] | None = setting(
        "listen-mesh-grpc",
        "a model host's gRPC address for the namespace's modelmesh-serving Service (8033)",
        address,
        default=None,
    )
    """As `listen_mesh_http`, for gRPC; None: not served."""
    routes_file: Path | None = setting(
        "routes-file",
        "the namespace's models and their Services' addresses, relayed to from the mesh ports",
        path,
        default=None,
    )
    """A JSON list of `{"model", "address", "http", "grpc", "maxConcurrency"}` (the binder's
    `tritonshare-mesh-routes` ConfigMap), reread every --models-check-seconds; missing: only
    the table's models are served on the mesh ports."""
    listen_metrics: tuple[str, int] = listen_flag("metrics", DEFAULT_PROXY_METRICS_PORT)
    """host and port of /metrics, /healthz and /readyz, kept off the Service port; default 9002."""
    max_body_bytes: int = max_body()
    """Largest REST body and gRPC message accepted and returned, in bytes; default 1 GiB."""
    max_inflated_bytes: int = max_inflated()
    """Largest size a compressed REST body (Content-Encoding gzip or deflate) or gRPC message
    (grpc-encoding gzip or deflate) may inflate to, in bytes; default 64 MiB. Counted as the
    compressed bytes pass, in bounded slices; a body or message past it is refused (413 /
    RESOURCE_EXHAUSTED) before its last byte reaches Triton, which would inflate it unbounded."""
    container_concurrency: int = setting(
        "container-concurrency", "in-flight inference limit, 0 = unlimited", whole(), default="0"
    )
    """Hard limit on in-flight inference requests; 0 means unlimited. Each request in flight on a
    ModelStreamInfer stream counts (an open stream at least one) in the relay mode; the grpcio
    mode counts a stream once."""
    queue_size: int | None = setting(
        "queue-size", "waiting requests allowed (default 10x the limit)", whole(), default=None
    )
    """Inference requests allowed to wait for a slot; None means 10x the concurrency limit."""
    queue_timeout_seconds: float = setting(
        "queue-timeout", "seconds a request may wait for a slot", seconds(), default="30"
    )
    """Seconds a request may wait for a slot before it is refused with 503/RESOURCE_EXHAUSTED."""
    drain_seconds: float = setting(
        "drain-seconds", "seconds to keep serving after SIGTERM", seconds(), default="5"
    )
    """Seconds to keep serving after SIGTERM while reporting not ready (endpoints update)."""
    finish_timeout_seconds: float = finish_timeout()
    """Seconds to wait for in-flight requests after the drain period before giving up on them."""
    connect_retry_seconds: float = connect_retry()
    """Seconds a request waits while its connection to the node gateway (in the gateway: to
    Triton) is refused, tried again 50 ms doubling to 0.5 s apart (proxy/reconnect.py): a
    restarted gateway or Triton listens again within it, and the request, which never left,
    is sent then. Past it: 502 / UNAVAILABLE, as at once with 0."""
    head_timeout_seconds: float = head_timeout()
    """Seconds a REST client may take to send a request's head once it has begun (a slower one is
    answered 408 and closed), and a gRPC client to send the HTTP/2 connection preface (else the
    connection closes), so slow senders cannot hold connections open (slowloris)."""
    idle_timeout_seconds: float = idle_timeout()
    """Seconds a tenant connection may stay open with no request or call in progress before it is
    closed (gRPC with GOAWAY, so clients reconnect on their next call); 0 keeps it forever."""
    concurrency_window_seconds: float = setting(
        "concurrency-window",
        "seconds of the average concurrency gauge",
        seconds(minimum=1.0),
        default="60",
    )
    """Window of the time-weighted average concurrency gauge, in seconds (Knative uses 60)."""
    agent_address: str = setting(
        "agent-address",
        "host:port of the node agent (empty: no unload on exit and no reinstall)",
        host_port,
        default="",
    )
    """host:port of the node's agent gRPC API; empty means do not ask for an unload on exit, nor
    for a reinstall of a model the node lost."""
    token_file: Path | None = setting(
        "token-file", "the pod's projected service-account token file", path, default=None
    )
    """The pod's projected service-account token (audience tritonshare-agent), read per call."""
    agent_timeout_seconds: float = setting(
        "agent-timeout",
        "seconds one agent call may take (the unload at exit, a reinstall's checks)",
        seconds(),
        default="30",
    )
    """Seconds one agent call may take: the unload on shutdown, and the GetModel and install
    calls of a reinstall."""
    model_dir: Path | None = setting(
        "model-dir",
        "the pod's copy of its model, read-only (reinstalled from there when the node lost it)",
        path,
        default=None,
    )
    """The pod's own copy of its model (the storage initializer's volume, mounted read-only);
    with it, a model the node has lost is installed and loaded again from there
    (proxy/reinstall.py). None: the proxy only reports it."""
    model_check_seconds: float = setting(
        "model-check-seconds",
        "seconds between looks at whether the node still serves the model",
        seconds(minimum=0.1),
        default="2",
    )
    """Seconds between two looks at whether the node still serves the pod's model; default 2.
    Each look is one readiness request through the node gateway; only an unready model costs an
    agent call (GetModel)."""
    reinstall_backoff_max_seconds: float = setting(
        "reinstall-backoff-max",
        "longest wait in seconds between two failed reinstalls",
        seconds(minimum=1.0),
        default="60",
    )
    """Longest wait after a failed reinstall before the next one, in seconds; default 60. The
    wait doubles from --model-check-seconds, jittered."""
    residency: str = setting(
        "residency",
        "the pod's residency class: always (kept loaded) or on-demand (unloaded when idle)",
        one_of(RESIDENCY_ALWAYS, RESIDENCY_ON_DEMAND),
        default=RESIDENCY_ALWAYS,
    )
    """`always` (default): the model stays loaded while the pod lives. `on-demand`: after
    --idle-seconds with no inference request held, the proxy asks the agent to unload it (files
    kept), and the next request loads it again while it waits (proxy/residency.py). The agent
    refuses the idle unload of a pod its proof of placement says is `always`."""
    idempotent: bool | None = setting(
        "idempotent",
        "true or false: the model's calls may run twice (no sequence batcher, no side effects); "
        "unset: as its config in Triton says",
        boolean,
        default=None,
    )
    """true: a call of the model lost before its answer began, with this pod's connection to the
    node gateway (the gateway's process restarting) or with the gateway's to Triton (Triton
    exiting), is sent again by this proxy, up to `table.RESENDS` times, if at most
    `table.RESEND_BYTES`. false: it fails (502, UNAVAILABLE), since Triton may have run it.
    Unset (default): true once the model's config in Triton has no sequence batcher and is not
    decoupled nor an ensemble (`common.modelconfig.calls_may_run_twice`), false until then."""
    idle_seconds: float = setting(
        "idle-seconds",
        "seconds with no inference request before an on-demand model is unloaded",
        seconds(minimum=1.0),
        default="300",
    )
    """Seconds with no inference request in flight or waiting before an on-demand model is
    unloaded; default 300. Read with --residency on-demand (the webhook writes it from the
    pod's `tritonshare.io/idle-seconds`, no lower than its --min-idle-seconds), and for a host's
    on-demand models without their own `idleSeconds`."""
    wake_timeout_seconds: float = setting(
        "wake-timeout-seconds",
        "seconds a request waits for its unloaded on-demand model to load (then 503)",
        seconds(positive=True),
        default="30",
    )
    """Seconds a request for an unloaded on-demand model waits for the model to load before it
    is answered 503 with Retry-After (gRPC UNAVAILABLE); default 30. The load itself goes on,
    up to --agent-timeout."""
    grpc_mode: str = setting(
        "grpc-mode",
        "gRPC endpoint: relay (HTTP/2 frame relay) or grpcio",
        one_of("grpcio", "relay"),
        default="relay",
    )
    """`relay` (default): the HTTP/2 frame relay (`proxy/grpc/relay.py`); `grpcio`: grpc.aio."""
    log_level: str = log_level_flag()
    """Root log level."""
    log_format: str = log_format_flag()
    """`text` for people, `json` for log pipelines."""
    key_prefix: str = setting(
        "key-prefix",
        "contract key prefix (accepted as every part takes it; the proxy reads no key)",
        text,
        default=DEFAULT_PREFIX,
    )
    """Contract key prefix (accepted for symmetry with the other parts; the proxy uses none)."""
    system_namespace: str = setting(
        "system-namespace",
        "the platform's namespace (accepted as every part takes it; the proxy reads none)",
        text,
        default=DEFAULT_SYSTEM_NAMESPACE,
    )
    """Namespace of the platform's components (accepted for symmetry with the other parts)."""

    @property
    def queue_limit(self) -> int:
        """How many requests may wait; 0 when there is no concurrency limit (nothing waits)."""
        if self.container_concurrency == 0:
            return 0
        if self.queue_size is None:
            return 10 * self.container_concurrency
        return self.queue_size

    @property
    def name_in_triton(self) -> str:
        """The model's name in Triton: `triton_name`, or `model_id` when none."""
        return self.triton_name or self.model_id


DECLARATION = Declaration.of(
    Settings,
    "python -m proxy",
    "Per-model KServe v2 REST and gRPC front door to the node's shared Triton.",
    error=SettingsError,
)


def parse_settings(argv: Sequence[str], env: Mapping[str, str] | None = None) -> Settings:
    """Read the flags (and `TRITONSHARE_*` variables) into Settings, or raise SettingsError."""
    settings = Settings(**DECLARATION.values(argv, os.environ if env is None else env))
    if not settings.model_id and settings.models_file is None:
        raise SettingsError(
            "--model-id is required (a model pod's model), or --models-file (a model host's "
            "table of models)"
        )
    if settings.model_id and settings.models_file is not None:
        raise SettingsError(
            "--model-id and --models-file are both set; a model pod passes --model-id, a model "
            "host --models-file: pass one"
        )
    if settings.models_file is not None:
        for flag, given in (
            ("--triton-name", settings.triton_name),
            ("--model-dir", settings.model_dir is not None),
            ("--residency on-demand", settings.residency == RESIDENCY_ON_DEMAND),
            ("--grpc-mode grpcio", settings.grpc_mode == "grpcio"),
        ):
            if given:
                raise SettingsError(
                    f"{flag} works with --model-id only, not with --models-file (each model of a "
                    "host has its residency in the file, and is served by the gRPC relay): drop it"
                )
    mesh = settings.listen_mesh_http or settings.listen_mesh_grpc or settings.routes_file
    if mesh and settings.models_file is None:
        raise SettingsError(
            "--listen-mesh-http, --listen-mesh-grpc and --routes-file are a model host's (the "
            "namespace's modelmesh-serving Service): pass them with --models-file"
        )
    if settings.source_address and settings.grpc_mode == "grpcio":
        raise SettingsError(
            "--source-address works with --grpc-mode relay only (grpc.aio cannot choose its "
            "source address)"
        )
    if settings.triton_name and settings.grpc_mode == "grpcio":
        raise SettingsError(
            "--triton-name works with --grpc-mode relay only (grpc.aio's proxy does not rename "
            "Triton's answers)"
        )
    if settings.agent_address and settings.token_file is None:
        raise SettingsError(
            "--agent-address is set but --token-file is not; the agent accepts only calls "
            "carrying the pod's projected token: pass its path"
        )
    if settings.model_dir is not None and not settings.agent_address:
        raise SettingsError(
            "--model-dir is set but --agent-address is not; a model the node lost is "
            "reinstalled through the node's agent: pass its host:port"
        )
    if settings.residency == RESIDENCY_ON_DEMAND and not settings.agent_address:
        raise SettingsError(
            "--residency on-demand is set but --agent-address is not; an idle model is "
            "unloaded and loaded again through the node's agent: pass its host:port"
        )
    return settings
