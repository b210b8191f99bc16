"""The proxy's Prometheus metrics, in one explicit registry per process.

Concurrency numbers (in flight, queued, request-seconds, windowed average) are read from the
limiter at scrape time, so the hot path only counts requests and observes latency. Labelled
children are cached, because looking them up costs more than the increment itself.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from proxy.limiter import Limiter

_LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip


class _ConcurrencyCollector(Collector):
    def __init__(self, limiter: Limiter, model_id: str) -> None:
        self._limiter = limiter
        self._model = model_id

    def collect(self) -> Iterator[Metric]:
        limiter = self._limiter
        labels = ["model"]
        values = [self._model]
        in_flight = GaugeMetricFamily(
            "tritonshare_proxy_requests_in_flight",
            "Inference requests being served now (a stream counts once).",
            labels=labels,
        )
        in_flight.add_metric(values, limiter.in_flight)
        queued = GaugeMetricFamily(
            "tritonshare_proxy_requests_queued",
            "Inference requests waiting for a concurrency slot.",
            labels=labels,
        )
        queued.add_metric(values, limiter.queued)
        area = CounterMetricFamily(
            "tritonshare_proxy_concurrency_seconds",
            "In-flight inference requests integrated over time; rate() is the average concurrency.",
            labels=labels,
        )
        area.add_metric(values, limiter.concurrency_seconds())
        average = GaugeMetricFamily(
            "tritonshare_proxy_average_concurrency",
            f"Time-weighted average of in-flight inference requests over the last "
            f"{limiter.window:g} s.",
            labels=labels,
        )
        average.add_metric(values, limiter.average_concurrency())
        limit = GaugeMetricFamily(
            "tritonshare_proxy_concurrency_limit",
            "The hard limit on in-flight inference requests (0 = unlimited).",
            labels=labels,
        )
        limit.add_metric(values, limiter.limit)
        yield from (in_flight, queued, area, average, limit)


class ProxyMetrics:
    """Counters and histograms the transports update, and the registry that exposes them."""

    def __init__(self, limiter: Limiter, model_id: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._requests = Counter(
            "tritonshare_proxy_requests",
            "Requests answered, by protocol, route and status (HTTP status or gRPC code).",
            ["protocol", "route", "code"],
            registry=self.registry,
        )
        self._latency = Histogram(
            "tritonshare_proxy_request_duration_seconds",
            "Time from receiving a request to finishing its answer, by protocol and route.",
            ["protocol", "route"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._rejected = Counter(
            "tritonshare_proxy_rejected_requests",
            "Requests refused by the proxy itself, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self.registry.register(_ConcurrencyCollector(limiter, model_id))
        self._request_children: dict[tuple[str, str, str], Counter] = {}
        self._latency_children: dict[tuple[str, str], Histogram] = {}

    def observe(self, protocol: str, route: str, code: str, seconds: float) -> None:
        """Count one answered request and its latency."""
        key = (protocol, route, code)
        counter = self._request_children.get(key)
        if counter is None:
            counter = self._request_children[key] = self._requests.labels(*key)
        counter.inc()
        latency_key = (protocol, route)
        histogram = self._latency_children.get(latency_key)
        if histogram is None:
            histogram = self._latency_children[latency_key] = self._latency.labels(*latency_key)
        histogram.observe(seconds)

    def rejected(self, reason: str) -> None:
        """Count one request the proxy refused (for example `queue_full`)."""
        self._rejected.labels(reason).inc()
