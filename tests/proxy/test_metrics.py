"""The proxy's request counter and latency histogram read exactly as prometheus_client's own would.

The proxy counts in plain dicts and builds the families at scrape time; these tests feed the same
observations to prometheus_client's Counter and Histogram (the oracle) and compare the scrapes.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from proxy.metrics import _LATENCY_BUCKETS, ProxyMetrics
from proxy.policy.limiter import Limiter

_OBSERVATION = st.tuples(
    st.sampled_from(["http", "grpc"]),
    st.sampled_from(["infer", "ready", "ModelInfer"]),
    st.sampled_from(["200", "503", "OK"]),
    st.one_of(
        st.sampled_from(_LATENCY_BUCKETS),  # exactly on a bound: `le` is inclusive
        st.floats(min_value=0, max_value=100, allow_nan=False),
    ),
)


def _samples(
    text: str, names: tuple[str, ...]
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name in names
    }


@settings(max_examples=60, deadline=None)
@given(st.lists(_OBSERVATION, max_size=40))
def test_scrape_matches_prometheus_clients_own_counter_and_histogram(
    observations: list[tuple[str, str, str, float]],
) -> None:
    metrics = ProxyMetrics(Limiter(0, 0, 1.0), "m")
    oracle = CollectorRegistry()
    requests = Counter(
        "tritonshare_proxy_requests", "x", ["model", "protocol", "route", "code"], registry=oracle
    )
    latency = Histogram(
        "tritonshare_proxy_request_duration_seconds",
        "x",
        ["model", "protocol", "route"],
        buckets=_LATENCY_BUCKETS,
        registry=oracle,
    )
    for protocol, route, code, seconds in observations:
        metrics.observe(protocol, route, code, seconds)
        requests.labels("m", protocol, route, code).inc()
        latency.labels("m", protocol, route).observe(seconds)

    names = (
        "tritonshare_proxy_requests_total",
        "tritonshare_proxy_request_duration_seconds_bucket",
        "tritonshare_proxy_request_duration_seconds_count",
        "tritonshare_proxy_request_duration_seconds_sum",
    )
    ours = _samples(generate_latest(metrics.registry).decode(), names)
    expected = _samples(generate_latest(oracle).decode(), names)
    assert ours.keys() == expected.keys()
    for key, value in expected.items():
        assert abs(ours[key] - value) <= 1e-9 * max(1.0, abs(value)), key


def test_an_observation_on_a_bound_lands_in_that_bucket() -> None:
    metrics = ProxyMetrics(Limiter(0, 0, 1.0), "m")
    metrics.observe("http", "infer", "200", 0.001)
    samples = _samples(
        generate_latest(metrics.registry).decode(),
        ("tritonshare_proxy_request_duration_seconds_bucket",),
    )
    by_bound = {dict(labels)["le"]: value for (_, labels), value in samples.items()}
    assert by_bound["0.0005"] == 0
    assert by_bound["0.001"] == 1
    assert by_bound["+Inf"] == 1
