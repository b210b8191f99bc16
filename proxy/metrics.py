"""The proxy's Prometheus metrics, in one explicit registry per process.

Concurrency numbers (in flight, queued, request-seconds, windowed average) are read from the
limiter at scrape time. Requests and their latency are counted in plain dicts on the event loop
and turned into a counter and a histogram at scrape time too: a prometheus_client child takes a
lock and walks every bucket per observation, which at ten thousand requests a second is a visible
share of the proxy's CPU, while a dict increment and a bisect are not. Scrapes run on the same
event loop, so nothing here needs a lock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from proxy.idle import IdleSweeper
from proxy.policy.limiter import Limiter
from proxy.residency import STATES, Residency

# A variable-length tuple, as written: compiled (mypyc 2.4.1), a fixed-length tuple of floats is
# kept unboxed and boxed anew (15 floats and a tuple) each time it is handed to Python code; as
# `Final` it raises NameError "value for final name was not set" at import (mypyc/mypyc#1183).
_LATENCY_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip


class _ConcurrencyCollector(Collector):
    """The limiter's numbers of each model of the table, by `model`."""

    def __init__(self) -> None:
        self.limiters: dict[str, Limiter] = {}
        self.more: dict[str, list[Limiter]] = {}
        """A model's other replicas' limiters (the node gateway's host): its series are sums."""

    def collect(self) -> Iterator[Metric]:
        labels = ["model"]
        in_flight = GaugeMetricFamily(
            "tritonshare_proxy_requests_in_flight",
            "Inference requests being served now (each request in flight on a stream counts; "
            "an open stream at least one).",
            labels=labels,
        )
        queued = GaugeMetricFamily(
            "tritonshare_proxy_requests_queued",
            "Inference requests waiting for a concurrency slot.",
            labels=labels,
        )
        area = CounterMetricFamily(
            "tritonshare_proxy_concurrency_seconds",
            "Inference requests held (in flight or waiting for a slot) integrated over time; "
            "rate() is the average concurrency.",
            labels=labels,
        )
        average = GaugeMetricFamily(
            "tritonshare_proxy_average_concurrency",
            "Time-weighted average of inference requests held (in flight or waiting) over the "
            "window (--concurrency-window).",
            labels=labels,
        )
        limit = GaugeMetricFamily(
            "tritonshare_proxy_concurrency_limit",
            "The limit on in-flight inference requests now (0 = unlimited); at the node gateway, "
            "the pod's share of --max-in-flight-node while several pods send.",
            labels=labels,
        )
        for model, first in list(self.limiters.items()):
            values = [model]
            limiters = [first, *self.more.get(model, ())]
            in_flight.add_metric(values, sum(each.in_flight for each in limiters))
            queued.add_metric(values, sum(each.queued for each in limiters))
            area.add_metric(values, sum(each.concurrency_seconds() for each in limiters))
            average.add_metric(values, sum(each.average_concurrency() for each in limiters))
            limits = [each.limit for each in limiters]
            limit.add_metric(values, 0 if 0 in limits else sum(limits))
        yield from (in_flight, queued, area, average, limit)


class _RequestCollector:
    """Answered requests by (protocol, route, code) and their latency by (protocol, route), each
    labelled with the pod's model id (series join the agent's and Triton's by `model`)."""

    def __init__(self, model_id: str) -> None:
        self._model = model_id
        # Per (protocol, route): a count per bucket (the last is +Inf), then the sum of seconds.
        self.latency: dict[tuple[str, str], list[float]] = {}
        # Per (protocol, route, code): its count (in a one-item list, so `observe` adds to it in
        # place) and its route's latency histogram, found with one lookup per request.
        self.series: dict[tuple[str, str, str], tuple[list[int], list[float]]] = {}

    @property
    def counts(self) -> dict[tuple[str, str, str], int]:
        """Requests answered by (protocol, route, code)."""
        return {labels: count[0] for labels, (count, _) in list(self.series.items())}

    def add_series(self, protocol: str, route: str, code: str) -> tuple[list[int], list[float]]:
        """The count of (protocol, route, code), new, and its route's histogram."""
        histogram = self.latency.get((protocol, route))
        if histogram is None:
            histogram = self.latency[protocol, route] = [0.0] * (len(_LATENCY_BUCKETS) + 2)
        series = self.series[protocol, route, code] = ([0], histogram)
        return series

    def add_to(self, requests: CounterMetricFamily, latency: HistogramMetricFamily) -> None:
        """Add this model's series to the families being collected."""
        for labels, count in self.counts.items():
            requests.add_metric([self._model, *labels], count)
        for route, counts in list(self.latency.items()):
            cumulative, buckets = 0.0, []
            for bound, in_bucket in zip(_BOUNDS, counts[:-1], strict=True):
                cumulative += in_bucket
                buckets.append((_bound_text(bound), cumulative))
            latency.add_metric([self._model, *route], buckets, counts[-1])


class _RequestsCollector(Collector):
    """The answered requests and latencies of every model of the table."""

    def __init__(self) -> None:
        self.models: dict[str, _RequestCollector] = {}

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "tritonshare_proxy_requests",
            "Requests answered, by protocol, route and status (HTTP status or gRPC code).",
            labels=["model", "protocol", "route", "code"],
        )
        latency = HistogramMetricFamily(
            "tritonshare_proxy_request_duration_seconds",
            "Time from receiving a request to finishing its answer, by protocol and route.",
            labels=["model", "protocol", "route"],
        )
        for model in list(self.models.values()):
            model.add_to(requests, latency)
        yield from (requests, latency)


class _ConnectionCollector(Collector):
    """Tenant connections open now and those closed for idling, by protocol, read at scrape
    time from each listener's idle sweep (which holds its live set of connections)."""

    def __init__(self) -> None:
        self.listeners: dict[str, IdleSweeper] = {}

    def collect(self) -> Iterator[Metric]:
        open_now = GaugeMetricFamily(
            "tritonshare_proxy_connections",
            "Tenant connections open now, by protocol.",
            labels=["protocol"],
        )
        closed = CounterMetricFamily(
            "tritonshare_proxy_idle_closed_connections",
            "Tenant connections closed after --idle-timeout with nothing in progress.",
            labels=["protocol"],
        )
        for protocol, sweeper in list(self.listeners.items()):
            open_now.add_metric([protocol], len(sweeper.connections))
            closed.add_metric([protocol], sweeper.closed)
        yield from (open_now, closed)


class _ResidencyCollector(Collector):
    """The on-demand models' states, sleeps and wakes, read from their residencies at scrape
    time (one collector for the process, one series per model)."""

    def __init__(self) -> None:
        self.models: dict[str, Residency] = {}

    def collect(self) -> Iterator[Metric]:
        state = GaugeMetricFamily(
            "tritonshare_proxy_model_state",
            "The on-demand model's state as its proxy sees it: 1 for the state it is in "
            "(loaded, unloading, idle-unloaded, waking), 0 for the others.",
            labels=["model", "state"],
        )
        sleeps = CounterMetricFamily(
            "tritonshare_proxy_model_sleeps",
            "Idle unloads of the on-demand model this proxy asked the agent for, by outcome "
            "(ok, refused).",
            labels=["model", "outcome"],
        )
        wakes = CounterMetricFamily(
            "tritonshare_proxy_model_wakes",
            "Loads of the on-demand model after it slept, by outcome (ok, failed).",
            labels=["model", "outcome"],
        )
        for model, residency in sorted(self.models.items()):
            for name in STATES:
                state.add_metric([model, name], 1.0 if residency.state == name else 0.0)
            sleeps.add_metric([model, "ok"], residency.sleeps)
            sleeps.add_metric([model, "refused"], residency.refused_sleeps)
            wakes.add_metric([model, "ok"], residency.wakes)
            wakes.add_metric([model, "failed"], residency.failed_wakes)
        yield from (state, sleeps, wakes)


def _bound_text(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


_BOUNDS = (*_LATENCY_BUCKETS, float("inf"))

_NOT_USABLE: frozenset[str] = frozenset(
    {"400", "404", "503", "INVALID_ARGUMENT", "NOT_FOUND", "UNAVAILABLE"}
)
"""Triton's answers for a model it does not have loaded (unknown, no ready version, unavailable),
REST and gRPC; also those of a bad request, which cost one needless model check."""
INFERENCE_ROUTES: frozenset[str] = frozenset(
    {"infer", "generate", "generate_stream", "ModelInfer", "ModelStreamInfer"}
)


class ProxyMetrics:
    """What the transports count for one model, and the registry that exposes it: a process's
    first `ProxyMetrics` makes the registry; those of the other models of its table pass it as
    `shared` and add their series (`model` label) to the same metrics."""

    def __init__(self, limiter: Limiter, model_id: str, shared: ProxyMetrics | None = None) -> None:
        self._requests = _RequestCollector(model_id)
        self._series = self._requests.series
        self._model = model_id
        self._reasons: set[str] = set()
        self._resent: set[str] = set()
        self._root: ProxyMetrics = shared or self
        self._residencies: _ResidencyCollector | None = None
        """The process's on-demand models (on its first `ProxyMetrics`, registered with the
        first one: a proxy of always models exposes none of their families)."""
        if shared is None:
            self.registry = CollectorRegistry(auto_describe=True)
            self._all_requests = _RequestsCollector()
            self.registry.register(self._all_requests)
            self._rejected_counter = Counter(
                "tritonshare_proxy_rejected_requests",
                "Requests refused by the proxy itself, by reason.",
                ["model", "reason"],
                registry=self.registry,
            )
            self._resent_counter = Counter(
                "tritonshare_proxy_resent_requests",
                "Requests of an idempotent model sent again after the node gateway's or "
                "Triton's exit lost them unanswered, by protocol.",
                ["model", "protocol"],
                registry=self.registry,
            )
            self._concurrency = _ConcurrencyCollector()
            self.registry.register(self._concurrency)
            self._wake_histogram = Histogram(
                "tritonshare_proxy_wake_seconds",
                "Time to load the on-demand model again after it slept, from the first request "
                "that found it unloaded to the agent's READY.",
                ["model"],
                buckets=(0.1, 0.25, 0.5, 1.0, 1.5, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0),
                registry=self.registry,
            )
            self._connections = _ConnectionCollector()
            self.registry.register(self._connections)
        else:
            self.registry = shared.registry
            self._all_requests = shared._all_requests
            self._rejected_counter = shared._rejected_counter
            self._resent_counter = shared._resent_counter
            self._concurrency = shared._concurrency
            self._wake_histogram = shared._wake_histogram
            self._connections = shared._connections
        if model_id:  # a host's server-wide requests count under no model
            self._concurrency.limiters[model_id] = limiter
        self._all_requests.models[model_id] = self._requests
        self._wake_seconds = self._wake_histogram.labels(model_id) if model_id else None
        self.on_not_usable: Callable[[], None] | None = None
        """Told of an inference answered as if the model were not loaded (an on-demand model
        evicted behind the proxy's back: `Residency.suspect`); None for an always model."""

    def also(self, limiter: Limiter) -> None:
        """Count `limiter`'s requests too: another replica of this model (the node gateway's
        host), whose requests the model's series add up."""
        self._concurrency.more.setdefault(self._model, []).append(limiter)

    def drop(self, limiter: Limiter) -> None:
        """Count `limiter`'s requests no more (`also`): that replica left."""
        more = self._concurrency.more.get(self._model, [])
        if limiter in more:
            more.remove(limiter)

    def forget(self) -> None:
        """Drop this model's series (it left the table)."""
        self._concurrency.limiters.pop(self._model, None)
        self._concurrency.more.pop(self._model, None)
        self._all_requests.models.pop(self._model, None)
        for reason in self._reasons:
            self._rejected_counter.remove(self._model, reason)
        for protocol in self._resent:
            self._resent_counter.remove(self._model, protocol)
        if self._wake_seconds is not None:
            self._wake_histogram.remove(self._model)
        residencies = self._root._residencies
        if residencies is not None:
            residencies.models.pop(self._model, None)

    def residency(self, residency: Residency) -> None:
        """Report this on-demand model's state, sleeps and wakes."""
        root = self._root
        if root._residencies is None:
            root._residencies = _ResidencyCollector()
            self.registry.register(root._residencies)
        root._residencies.models[residency.model_id] = residency

    def woke(self, seconds: float) -> None:
        """Count one wake of the on-demand model and how long its load took (a wake is rare:
        the histogram child's lock costs nothing that matters here)."""
        if self._wake_seconds is not None:
            self._wake_seconds.observe(seconds)

    def listener(self, protocol: str, sweeper: IdleSweeper) -> None:
        """Report the connections of a listener (`http`, `grpc`) through its idle sweep."""
        self._connections.listeners[protocol] = sweeper

    def observe(self, protocol: str, route: str, code: str, seconds: float) -> None:
        """Count one answered request and its latency."""
        series = self._series.get((protocol, route, code))
        if series is None:
            series = self._requests.add_series(protocol, route, code)
        count, histogram = series
        count[0] += 1
        # The first bound not below `seconds` (as `bisect.bisect_left`), found by a loop:
        # compiled (mypyc), a loop of float compares, where the call to `bisect_left` boxes its
        # arguments (about 750 instructions a request); latencies sit in the first few buckets.
        bucket = 0
        for bound in _LATENCY_BUCKETS:
            if bound >= seconds:
                break
            bucket += 1
        histogram[bucket] += 1
        histogram[-1] += seconds
        told = self.on_not_usable
        if told is not None and code in _NOT_USABLE and route in INFERENCE_ROUTES:
            told()

    def answered_with(self, codes: frozenset[str], routes: frozenset[str] | None = None) -> int:
        """Requests answered so far with one of `codes` (HTTP statuses, gRPC code names), of
        `routes` only when given."""
        return sum(
            count[0]
            for (_, route, code), (count, _) in self._series.items()
            if code in codes and (routes is None or route in routes)
        )

    def counts(self) -> dict[str, list[float]]:
        """Every model's [seconds its requests were held (in flight or queued), inference
        requests answered], cumulative: the built-in autoscaler's one read per host a second
        (/autoscaling), a few bytes a model where /metrics is kilobytes."""
        root = self._root
        models = root._all_requests.models
        answers: dict[str, list[float]] = {}
        for model, limiter in list(root._concurrency.limiters.items()):
            requests = models.get(model)
            answered = 0
            if requests is not None:
                answered = sum(
                    count[0]
                    for (_, route, _), (count, _) in list(requests.series.items())
                    if route in INFERENCE_ROUTES
                )
            held = limiter.concurrency_seconds() + sum(
                more.concurrency_seconds() for more in root._concurrency.more.get(model, ())
            )
            answers[model] = [round(held, 6), answered]
        return answers

    def resent(self, protocol: str) -> None:
        """Count one request sent again after the gateway's or Triton's exit lost it."""
        self._resent.add(protocol)
        self._resent_counter.labels(self._model, protocol).inc()

    def rejected(self, reason: str) -> None:
        """Count one request the proxy refused (for example `queue_full`)."""
        self._reasons.add(reason)
        self._rejected_counter.labels(self._model, reason).inc()
