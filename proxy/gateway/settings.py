"""The gateway's settings: one frozen object whose fields each declare their flag once with
common.settings (`DECLARATION` is derived from them), parsed once in `__main__`.

Every flag has an environment variable `TRITONSHARE_<FLAG_UPPER>`; a flag on the command line
wins over the variable. The relay knobs (body limit, timeouts) mean what they mean for the proxy,
whose relay the gateway runs once per calling pod (`relay_settings`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from common.contract import (
    DEFAULT_GATEWAY_GRPC_PORT,
    DEFAULT_GATEWAY_HTTP_PORT,
    DEFAULT_GATEWAY_METRICS_PORT,
)
from common.settings import (
    Declaration,
    declared,
    host_port,
    log_format_flag,
    log_level_flag,
    number,
    one_of,
    path,
    quantity,
    seconds,
    setting,
    whole,
    whole_or_cpus,
)
from proxy.settings import (
    Settings,
    SettingsError,
    connect_retry,
    finish_timeout,
    head_timeout,
    idle_timeout,
    listen_flag,
    max_body,
    max_inflated,
)


@declared
class GatewaySettings:
    """Everything the gateway needs to run; each field declared once with its flag."""

    caller_table: Path = setting(
        "caller-table",
        "the agent's caller table file",
        path,
        required="the file the node's agent writes (its --gateway-table)",
    )
    """The agent's caller table (`common.callers`): which pod address may reach which model."""
    activity_table: Path | None = setting(
        "activity-table",
        "file the gateway writes its models' activity to, for the agent; default: "
        "activity.json beside --caller-table",
        path,
        default=None,
    )
    """Where the gateway writes which models are serving (`common.activity`), for the agent's
    evictions. Default: `activity.json` in the directory of `caller_table` (the volume shared
    with the agent)."""
    crash_witness_file: Path | None = setting(
        "crash-witness-file",
        "file recording which pods had requests at Triton when it died (read by the agent); "
        "default: crash-witness.json beside --caller-table",
        path,
        default=None,
    )
    """Where the gateway records Triton's deaths for the agent (`gateway.witness`), in a volume
    the agent reads (its --crash-witness-file)."""
    triton_http_url: str = setting(
        "triton-http-url",
        "host:port of Triton's HTTP endpoint",
        host_port,
        default="127.0.0.1:8000",
    )
    """host:port of Triton's HTTP endpoint, on the node pod's loopback."""
    triton_grpc_url: str = setting(
        "triton-grpc-url",
        "host:port of Triton's gRPC endpoint",
        host_port,
        default="127.0.0.1:8001",
    )
    """host:port of Triton's gRPC endpoint, on the node pod's loopback."""
    listen_http: tuple[str, int] = listen_flag("http", DEFAULT_GATEWAY_HTTP_PORT)
    """Where model pods' proxies send KServe v2 REST; default 0.0.0.0:8010."""
    listen_grpc: tuple[str, int] = listen_flag("grpc", DEFAULT_GATEWAY_GRPC_PORT)
    """Where model pods' proxies send gRPC; default 0.0.0.0:8011."""
    listen_metrics: tuple[str, int] = listen_flag("metrics", DEFAULT_GATEWAY_METRICS_PORT)
    """/metrics, /healthz and /readyz; default 0.0.0.0:8012."""
    keep_listening: bool = setting(
        "keep-listening",
        "bind the REST and gRPC listeners in a keeper process that starts the gateway again at "
        "once when it exits, so that the ports never refuse a proxy meanwhile",
        default=False,
        switch=True,
    )
    """`proxy.gateway.keep`: connections made while the gateway process restarts wait in the
    listeners' backlog instead of being refused. The node pod's gateway runs with it."""
    table_poll_seconds: float = setting(
        "table-poll-seconds",
        "seconds between checks of the caller table file",
        seconds(positive=True),
        default="0.1",
    )
    """How often the caller table's file is checked for a change (a stat, nothing more)."""
    table_max_age_seconds: float = setting(
        "table-max-age",
        "seconds after which an unrefreshed caller table counts as empty",
        seconds(positive=True),
        default="60",
    )
    """A table the agent has not rewritten for this long is treated as empty: every pod is
    refused until the agent writes again (it rewrites every few seconds), except those of
    `table_stale_grace_seconds`."""
    table_stale_grace_seconds: float = setting(
        "table-stale-grace",
        "seconds past --table-max-age during which the last fresh table's pods are still "
        "served, and no other; 0 = none",
        seconds(),
        default="300",
    )
    """Seconds past `table_max_age_seconds` during which a table this gateway saw fresh still
    serves the pods it had then, and admits no other: a lost agent does not cut off a running
    Triton's pods at once. The price is revocation: a pod deleted meanwhile keeps its access (and
    a pod given its address reaches its model only) until this ends. 300 s is Kubernetes' own
    grace for pods of an unreachable node, and the agent-down alert fires within it. 0: none."""
    caller_identity: str = setting(
        "caller-identity",
        "how a connection names its pod: 'key-or-address' (a caller key, else the source "
        "address) or 'key' (a caller key only)",
        one_of("key-or-address", "key"),
        default="key-or-address",
    )
    """A connection that presents a caller key (`common.callerkeys`) is its key's pod from any
    address but another caller's; one that presents none is known by its source address
    (`key-or-address`: proxies of the version before keys, on a CNI that keeps pods' addresses) or
    refused (`key`)."""
    caller_key_timeout_seconds: float = setting(
        "caller-key-timeout",
        "seconds a new connection has to present its caller key",
        seconds(positive=True),
        default="5",
    )
    """A connection whose first bytes have not come within this is closed; a proxy sends its key
    with the connection's first packet, so only a stalled peer waits."""
    max_silent_per_address: int = setting(
        "max-silent-connections-per-address",
        "connections from one source address that may wait at once for their first bytes",
        whole(minimum=1),
        default="64",
    )
    """Connections from one source address that have sent nothing yet (no caller key, no
    protocol byte) and wait for it, each at most `caller_key_timeout_seconds`; one more from that
    address that has sent nothing when it is accepted is reset at once, so one address's flood of
    silent connections takes none of another's waiting room."""
    # The relay's limits, with the proxy's flags, variables and defaults.
    max_body_bytes: int = max_body()
    max_inflated_bytes: int = max_inflated()
    head_timeout_seconds: float = head_timeout()
    idle_timeout_seconds: float = idle_timeout()
    finish_timeout_seconds: float = finish_timeout()
    connect_retry_seconds: float = connect_retry()
    """Seconds a request waits while Triton refuses connections (it restarts), sent once it
    listens again; past it: 502 / UNAVAILABLE."""
    restore_hold_seconds: float = setting(
        "restore-hold-seconds",
        "seconds a new request waits, after Triton exited, for its model to be loaded again "
        "(0: never held)",
        seconds(),
        default="20",
    )
    """From Triton's exit until its model is READY again in the restarted Triton, a new request
    waits, this long at most, then goes on; the same bound after Triton is back lets every
    model's requests go (`gateway.restore`). 0: requests meet Triton as it restarts."""
    max_connections_per_pod: int = setting(
        "max-connections-per-pod",
        "connections one pod may hold open",
        whole(minimum=1),
        default="512",
    )
    """Connections one pod may hold open to the gateway; more are reset at accept, so one pod
    cannot take the gateway's file descriptors from the others."""
    max_in_flight_per_pod: int = setting(
        "max-in-flight-per-pod",
        "requests one pod may have at Triton (its declared concurrency, up to this), 0 = no limit",
        whole(),
        default="64",
    )
    """Inference requests one pod may have at Triton at once through the gateway, even a pod
    that bypasses its proxy: a pod that declares its proxy's concurrency (`--container-concurrency`,
    in the caller table) gets that, up to this; a pod that declares none gets this; 0: no limit.
    As many more may wait (up to the relay's queue timeout); past that, 503 / RESOURCE_EXHAUSTED."""
    max_in_flight_node: int = setting(
        "max-in-flight-node",
        "requests all pods together may have at Triton while more than one pod is sending: "
        "split among the namespaces sending, then among each one's pods sending (at least 1, "
        "at most a pod's own limit); a pod sending alone keeps its own limit; auto = the "
        "node's CPUs, 0 = no node budget",
        whole_or_cpus,
        default="auto",
    )
    """The node's in-flight budget (`policy.inflight`): while N namespaces are sending, n pods of a
    pod's namespace among them, the pod may have `max(1, max(1, this // N) // n)` inference requests
    at Triton (never more than its own limit, above), and its next ones wait in its queue, which
    keeps its own length: a namespace gains nothing by running more pods. A pod sending alone keeps
    its own limit, so dynamic batching still gets a lone pod's concurrency. Without it a pod
    flooding within its own limit takes Triton (and the node's cores, which Triton's request
    handling and backends run on) from its neighbours. `auto`, the default, is the node's CPUs (the
    process's CPU affinity): on a small CPU node a flooding pod beside a steady one then has 1
    request at Triton, which kept the victim's p99 within a few times its p99 alone
    (docs/results.md, "Current figures"). On a GPU node, where the GPU is what the pods
    share, set it to the requests the node's models can run at once. 0: each pod bounded by its
    own limit only."""
    max_buffered_bytes: int = setting(
        "max-buffered-bytes",
        "bytes the gateway may hold for all pods together (received and not yet forwarded, "
        "answers not yet read), a quantity such as 672Mi; 0 = no budget",
        quantity(),
        default="672Mi",
    )
    """The node's byte budget (`policy.holdings`): what the gateway may hold for every pod
    together. Past it, a pod over its fair share (this divided among the pods holding anything or
    active) stops being read, and after a second its largest connections are answered
    (503 / RESOURCE_EXHAUSTED) and closed; a pod under its share is never held back. The gateway
    then holds under twice this (and under this once the grace has passed), so the default is
    the deploy limit less the base and headroom, halved: (1536Mi - 64Mi - 128Mi) / 2 = 672Mi
    (`gateway.budget.worst_case`). 0: no budget, each pod bounded on its own only."""
    loop_busy_percent: float = setting(
        "loop-busy-percent",
        "while several pods are active, the percent of each event-loop round the pods' "
        "reads may take before one past its fair share waits for the next round",
        number(minimum=1.0, below=100.000001),
        default="50",
    )
    """While more than one pod is active, the most of each round of the event loop (percent)
    that reading the pods' sockets may take before a pod past its fair share (the round split
    evenly among the active pods) stops being read until the round ends (`policy.share`); the
    rest stays free for a neighbour's next request. A pod alone is never held back; 100: pods
    take what their neighbours leave, and only the fair share is kept for each."""
    probation_clean_turns: int = setting(
        "probation-clean-turns",
        "clean turns in a row, each with another probationer waiting, after which a pod on "
        "probation stops taking turns at Triton with other probationers; 0 = never before its "
        "probation ends",
        whole(),
        default="10",
    )
    """A pod on probation whose last this many turns in the probation lane, each taken while
    another probationer waited, had requests answered with Triton alive leaves the lane early
    (`policy.probation`); named at another
    exit of Triton, it takes turns again until its probation ends. 0: it takes turns until its
    probation ends."""
    log_level: str = log_level_flag()
    log_format: str = log_format_flag()

    @property
    def activity_path(self) -> Path:
        """The activity table's file: `activity_table`, else beside the caller table."""
        return self.activity_table or self.caller_table.parent / "activity.json"

    def in_flight_limit(self, declared: int) -> int:
        """The in-flight limit of a pod whose proxy declares concurrency `declared` (0: none)."""
        ceiling = self.max_in_flight_per_pod
        if declared <= 0:
            return ceiling
        return declared if ceiling == 0 else min(declared, ceiling)

    def relay_settings(self, model_id: str, declared: int = 0) -> Settings:
        """The proxy relay's settings for one calling pod whose model is `model_id` and whose
        proxy declares concurrency `declared` (0: none). The queue is as long as the limit: a
        pod's proxy frees its slot a moment after the gateway frees its own, and a request that
        races in between waits instead of being refused."""
        limit = self.in_flight_limit(declared)
        return Settings(
            model_id=model_id,
            triton_http_url=self.triton_http_url,
            triton_grpc_url=self.triton_grpc_url,
            max_body_bytes=self.max_body_bytes,
            max_inflated_bytes=self.max_inflated_bytes,
            container_concurrency=limit,
            queue_size=limit,
            head_timeout_seconds=self.head_timeout_seconds,
            idle_timeout_seconds=self.idle_timeout_seconds,
            connect_retry_seconds=self.connect_retry_seconds,
            finish_timeout_seconds=self.finish_timeout_seconds,
            drain_seconds=0.0,
        )


DECLARATION = Declaration.of(
    GatewaySettings,
    "python -m proxy.gateway",
    "The node gateway: lets each model pod reach only its own model in the node's Triton, "
    "knowing the pod by its connection's source address.",
    error=SettingsError,
)


def parse_settings(argv: Sequence[str], env: Mapping[str, str] | None = None) -> GatewaySettings:
    """Read the flags (and `TRITONSHARE_*` variables) into settings, or raise SettingsError."""
    return GatewaySettings(**DECLARATION.values(argv, os.environ if env is None else env))
