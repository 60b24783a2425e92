"""Prometheus metrics of one proxy.

The hot path only bumps plain Python numbers (prometheus_client's own metric objects
take a lock and validate on every update); a collector turns them into metric
families when /metrics is scraped. Label sets are bounded: endpoints x statuses the
proxy sends, a fixed set of error kinds, and the known backends.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.utils import floatToGoString

from harness.proxy.backends import Backend, Pool

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class _Count:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def inc(self, n: int = 1) -> None:
        self.value += n

    def dec(self, n: int = 1) -> None:
        self.value -= n


class _Labeled:
    """A counter family: `.labels(*values).inc()`, as with prometheus_client."""

    def __init__(self) -> None:
        self.children: dict[tuple[str, ...], _Count] = {}

    def labels(self, *values: str) -> _Count:
        child = self.children.get(values)
        if child is None:
            child = self.children[values] = _Count()
        return child


class _Hist:
    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(LATENCY_BUCKETS, value)] += 1
        self.sum += value


class ProxyMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.requests = _Labeled()  # endpoint, status
        self.errors = _Labeled()  # kind
        self.registrations = _Labeled()  # result
        self.in_flight = _Count()
        self.kv_missing = _Count()
        self._now = 0.0
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def request_done(self, endpoint: str, status: int) -> None:
        self.requests.labels(endpoint, str(status)).inc()

    def attach(self, b: Backend) -> Any:
        """(latency histogram, failure counter) of a backend, kept on it."""
        if b.metrics is None:
            b.metrics = (_Hist(), _Count())
        return b.metrics

    def render(self, now: float) -> bytes:
        self._now = now
        return generate_latest(self.registry)

    def collect(self) -> Iterator[Metric]:
        def counter(name: str, doc: str, labels: list[str], fam: _Labeled) -> Metric:
            m = CounterMetricFamily(name, doc, labels=labels)
            for values, child in sorted(fam.children.items()):
                m.add_metric(list(values), child.value)
            return m

        yield counter(
            "pdbench_proxy_requests",
            "Client requests by endpoint and HTTP status",
            ["endpoint", "status"],
            self.requests,
        )
        yield counter("pdbench_proxy_errors", "Failed client requests by cause", ["kind"], self.errors)
        yield counter(
            "pdbench_proxy_registrations", "MoRI-IO registration messages by outcome", ["result"], self.registrations
        )
        yield GaugeMetricFamily(
            "pdbench_proxy_requests_in_flight", "Client requests being served", value=self.in_flight.value
        )
        yield CounterMetricFamily(
            "pdbench_proxy_kv_params_missing",
            "Prefill responses without usable kv_transfer_params",
            value=self.kv_missing.value,
        )

        now, pool = self._now, self.pool
        hist = HistogramMetricFamily(
            "pdbench_proxy_backend_latency_seconds",
            "Duration of one upstream leg (decode: until its last byte)",
            labels=["role", "backend"],
        )
        fails = CounterMetricFamily(
            "pdbench_proxy_backend_failures", "Failed upstream legs", labels=["role", "backend"]
        )
        up = GaugeMetricFamily(
            "pdbench_proxy_backend_up", "1 if the instance is ready and not taken out", labels=["role", "backend"]
        )
        outstanding = GaugeMetricFamily(
            "pdbench_proxy_backend_outstanding",
            "Legs in flight per instance (from every proxy process)",
            labels=["role", "backend"],
        )
        peak = GaugeMetricFamily(
            "pdbench_proxy_backend_outstanding_peak",
            "Most legs in flight per instance at once since the proxy started (from every proxy process)",
            labels=["role", "backend"],
        )
        routed = CounterMetricFamily(
            "pdbench_proxy_backend_routed", "Legs this proxy process routed to the instance", labels=["role", "backend"]
        )
        for b in pool.all():
            labels = [b.role, b.url]
            h, f = self.attach(b)
            cum, buckets = 0, []
            for bound, n in zip((*map(floatToGoString, LATENCY_BUCKETS), "+Inf"), h.counts, strict=False):
                cum += n
                buckets.append((bound, cum))
            hist.add_metric(labels, buckets, h.sum)
            fails.add_metric(labels, f.value)
            up.add_metric(labels, 1 if b.out_since is None and pool.ready(b, now) else 0)
            outstanding.add_metric(labels, b.load())
            peak.add_metric(labels, b.peak)
            routed.add_metric(labels, b.picks)
        yield from (hist, fails, up, outstanding, peak, routed)

        ready = GaugeMetricFamily("pdbench_proxy_ready_instances", "Ready instances per role", labels=["role"])
        expected = GaugeMetricFamily("pdbench_proxy_expected_instances", "Expected instances per role", labels=["role"])
        wants = [("prefill", pool.cfg.want_prefill), ("decode", pool.cfg.want_decode)]
        if pool.cfg.use.instances == "aggregated":
            wants = [("aggregated", pool.cfg.want_aggregated)]
        for role, want in wants:
            ready.add_metric([role], pool.count_available(role, now))  # type: ignore[arg-type]
            expected.add_metric([role], want)
        yield from (ready, expected)
