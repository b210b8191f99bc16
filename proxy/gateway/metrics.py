"""The gateway's Prometheus metrics: its own, and each calling pod's relay series renamed.

Each tenant's relays count into a `proxy.metrics.ProxyMetrics` of their own (the proxy's code, run
once per pod); at scrape time this collector renames their `tritonshare_proxy_*` series to
`tritonshare_gateway_*` and labels them with the pod (they already carry the model), so one
/metrics shows every caller. The gateway's own series: connections refused by reason, callers in
the table, the table's age, whether a stale table is being served, and the node's byte budget
(what is held for all pods, the budget, how often pods were paused or shed for it: node totals,
since bytes per pod would be a series per pod that changes every walk). Scrapes run on the event
loop, like the relays.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from proxy.gateway.callerbook import CallerBook
from proxy.gateway.tenants import Tenant
from proxy.policy.holdings import ByteBudget
from proxy.policy.inflight import InFlightShares
from proxy.policy.probation import HeldRequests

_PROXY = "tritonshare_proxy_"
_GATEWAY = "tritonshare_gateway_"


class _TenantCollector(Collector):
    def __init__(self, tenants: Callable[[], Iterable[Tenant]]) -> None:
        self._tenants = tenants

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        read = CounterMetricFamily(
            "tritonshare_gateway_loop_read_seconds",
            "Seconds the gateway's event loop spent reading the pod's connections (its charge "
            "against its share of the loop).",
            labels=["pod", "model"],
        )
        pauses = CounterMetricFamily(
            "tritonshare_gateway_loop_pauses",
            "Times the pod's connections stopped reading until the end of an event-loop round, "
            "for being past its share of the loop while other pods were active.",
            labels=["pod", "model"],
        )
        for tenant in self._tenants():
            # A host's series carry each model's own label; its loop share is the pod's.
            model = "" if tenant.host else tenant.caller.model_id
            extra = (
                {"pod": tenant.caller.pod}
                if tenant.host
                else {"pod": tenant.caller.pod, "model": model}
            )
            read.add_metric([tenant.caller.pod, model], tenant.share.seconds)
            pauses.add_metric([tenant.caller.pod, model], tenant.share.pauses)
            for metric in tenant.metrics.registry.collect():
                name = _GATEWAY + metric.name.removeprefix(_PROXY)
                family = families.get(name)
                if family is None:
                    family = families[name] = Metric(name, metric.documentation, metric.type)
                for sample in metric.samples:
                    family.add_sample(
                        _GATEWAY + sample.name.removeprefix(_PROXY),
                        {**sample.labels, **extra},
                        sample.value,
                        sample.timestamp,
                        sample.exemplar,
                    )
        yield from families.values()
        yield from (read, pauses)


class _BookCollector(Collector):
    def __init__(self, book: CallerBook) -> None:
        self._book = book

    def collect(self) -> Iterator[Metric]:
        callers = GaugeMetricFamily(
            "tritonshare_gateway_callers",
            "Pods the caller table lets reach their model through this gateway now.",
        )
        callers.add_metric([], len(self._book.callers))
        age = GaugeMetricFamily(
            "tritonshare_gateway_caller_table_age_seconds",
            "Seconds since the agent last wrote the caller table (-1: no table).",
        )
        table_age = self._book.age()
        age.add_metric([], -1.0 if table_age is None else table_age)
        stale = GaugeMetricFamily(
            "tritonshare_gateway_caller_table_stale",
            "1 while the caller table is older than --table-max-age and the gateway still serves "
            "the pods of the last fresh table (within --table-stale-grace), else 0.",
        )
        stale.add_metric([], 1.0 if self._book.stale else 0.0)
        probation = GaugeMetricFamily(
            "tritonshare_gateway_probation_pods",
            "Pods on probation (present with another at an exit of Triton): their requests take "
            "turns at Triton with the other probationers'.",
        )
        probation.add_metric(
            [], sum(c.probation for rows in self._book.callers.values() for c in rows.values())
        )
        yield from (callers, age, stale, probation)


class _BudgetCollector(Collector):
    def __init__(self, budget: ByteBudget) -> None:
        self._budget = budget

    def collect(self) -> Iterator[Metric]:
        held = GaugeMetricFamily(
            "tritonshare_gateway_held_bytes",
            "Bytes the gateway held for every pod together at its last walk (received and not "
            "yet forwarded, answers not yet read, unsent writes).",
        )
        held.add_metric([], self._budget.total)
        limit = GaugeMetricFamily(
            "tritonshare_gateway_budget_bytes",
            "The node's byte budget (--max-buffered-bytes).",
        )
        limit.add_metric([], self._budget.limit)
        holds = CounterMetricFamily(
            "tritonshare_gateway_budget_pauses",
            "Times a pod's connections stopped reading for being past its share of the node's "
            "byte budget while the gateway was over it.",
        )
        holds.add_metric([], self._budget.holds)
        sheds = CounterMetricFamily(
            "tritonshare_gateway_budget_sheds",
            "Times a pod past its share of the node's byte budget for longer than the grace had "
            "its largest connections answered (503 / RESOURCE_EXHAUSTED) and closed.",
        )
        sheds.add_metric([], self._budget.sheds)
        yield from (held, limit, holds, sheds)


class _InFlightCollector(Collector):
    def __init__(self, in_flight: InFlightShares) -> None:
        self._in_flight = in_flight

    def collect(self) -> Iterator[Metric]:
        sending = GaugeMetricFamily(
            "tritonshare_gateway_pods_sending",
            "Pods counted as sending now (a request in flight, waiting, or started in the last "
            "second): while more than one is, each may have --max-in-flight-node over their "
            "number at Triton (tritonshare_gateway_concurrency_limit, per pod).",
        )
        sending.add_metric([], self._in_flight.sending)
        namespaces = GaugeMetricFamily(
            "tritonshare_gateway_namespaces_sending",
            "Namespaces with a pod counted as sending now: the node's in-flight budget is split "
            "among them first, then among each one's pods sending.",
        )
        namespaces.add_metric([], self._in_flight.namespaces)
        # One series per namespace sending now: bounded by the namespaces of the node's pods.
        by_namespace = GaugeMetricFamily(
            "tritonshare_gateway_namespace_pods_sending",
            "Pods of the namespace counted as sending now: they share the namespace's part of "
            "the node's in-flight budget (only namespaces sending are listed).",
            labels=["namespace"],
        )
        for namespace, pods in sorted(self._in_flight.by_namespace.items()):
            by_namespace.add_metric([namespace], pods)
        budget = GaugeMetricFamily(
            "tritonshare_gateway_in_flight_budget",
            "The node's in-flight budget at Triton split among the namespaces sending, then "
            "among their pods sending (--max-in-flight-node).",
        )
        budget.add_metric([], self._in_flight.budget)
        yield from (sending, namespaces, by_namespace, budget)


class _HeldCollector(Collector):
    def __init__(self, held: HeldRequests) -> None:
        self._held = held

    def collect(self) -> Iterator[Metric]:
        # By namespace, never by pod: at most `MAX_HELD_NAMESPACES` series (others under "").
        requests = CounterMetricFamily(
            "tritonshare_gateway_probation_held_requests",
            "Requests held while a load the agent watches was in flight or settling "
            "(probationers', and every pod's through a suspected file's trial), by namespace and "
            "how the hold ended: released (it ended), timed_out (the request went on after its "
            "bound), refused (a suspect's trial: answered 503).",
            labels=["namespace", "outcome"],
        )
        for (namespace, outcome), count in sorted(self._held.requests.items()):
            requests.add_metric([namespace, outcome], count)
        seconds = CounterMetricFamily(
            "tritonshare_gateway_probation_held_seconds",
            "Seconds requests were held for watched loads (see probation_held_requests), by "
            "namespace.",
            labels=["namespace"],
        )
        for namespace, held in sorted(self._held.seconds.items()):
            seconds.add_metric([namespace], held)
        yield from (requests, seconds)


class GatewayMetrics:
    """The registry /metrics serves, and the gateway's own counters."""

    def __init__(
        self,
        book: CallerBook,
        tenants: Callable[[], Iterable[Tenant]],
        budget: ByteBudget | None = None,
        in_flight: InFlightShares | None = None,
        held: HeldRequests | None = None,
        starts: int = 1,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        Gauge(
            "tritonshare_gateway_process_starts",
            "Which start of the gateway's process in its container this is: 1, or more once its "
            "keeper (--keep-listening) started it again after an exit.",
            registry=self.registry,
        ).set(starts)
        self._refused = Counter(
            "tritonshare_gateway_refused_connections",
            "Connections closed at accept, by reason: not_a_caller (the address is no proven "
            "model pod of this node), no_table (no fresh caller table), too_many_connections "
            "(the pod holds --max-connections-per-pod already), too_many_silent (its source "
            "address holds --max-silent-connections-per-address connections that have sent "
            "nothing yet), "
            "over_budget (the pod is stopped for holding more than its share of "
            "--max-buffered-bytes), or a caller key's reason (no_key, bad_key, address_mismatch, "
            "no_key_in_time).",
            ["protocol", "reason"],
            registry=self.registry,
        )
        self.registry.register(_BookCollector(book))
        self.registry.register(_TenantCollector(tenants))
        if budget is not None:
            self.registry.register(_BudgetCollector(budget))
        if in_flight is not None:
            self.registry.register(_InFlightCollector(in_flight))
        if held is not None:
            self.registry.register(_HeldCollector(held))

    def refused(self, protocol: str, reason: str) -> None:
        self._refused.labels(protocol, reason).inc()
