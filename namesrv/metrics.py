"""Prometheus metrics of a name server: a registry of its own, served at ``GET /metrics`` by a task in the
name server's nursery (``trimq-namesrv --metrics-port``). A broker with ``--embedded-namesrv`` exports the
route metrics from its own registry (:class:`NamesrvCollector` without the server part).

Everything but the request latency is read from the route tables when scraped.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import trio
from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from trimq.namesrv.routes import RouteInfoManager
from trimq.runtime.logs import RateLimiter, get_logger, log_rate_limited
from trimq.runtime.metrics_http import serve_metrics
from trimq.runtime.rpc_metrics import RpcMetrics

if TYPE_CHECKING:
    from trimq.runtime.server import RemotingServer

log = get_logger("trimq.metrics")

__all__ = ["METRICS", "NamesrvCollector", "NamesrvMetrics"]

#: name -> (type, labels, meaning), as broker.metrics.METRICS (docs/OPERATIONS.md lists them; a test checks).
METRICS: dict[str, tuple[str, str, str]] = {
    "trimq_rpc_latency_seconds": ("histogram", "request_code, response_code",
                                  "time to handle one request; _count is the number of requests"),
    "trimq_namesrv_brokers": ("gauge", "cluster", "brokers registered and alive"),
    "trimq_namesrv_broker_registration_age_seconds": ("gauge", "cluster, broker_name, broker_addr",
                                                      "time since the broker last registered (expired after "
                                                      "broker_channel_expired_ms)"),
    "trimq_namesrv_topics": ("gauge", "", "topics with a route"),
    "trimq_namesrv_clusters": ("gauge", "", "clusters with at least one broker"),
    "trimq_connections": ("gauge", "", "open connections (standalone name server)"),
    "trimq_connections_refused_total": ("counter", "", "connections refused at max_connections"),
    "trimq_protocol_errors_total": ("counter", "", "connections closed for a malformed frame"),
}


def _doc(name: str) -> str:
    return METRICS[name][2]


class NamesrvCollector:
    """Route-table gauges, read at scrape time on the trio thread (liveness uses the trio clock)."""

    def __init__(self, routes: RouteInfoManager, server: RemotingServer | None = None) -> None:
        """``server``: also export its connection counters (a standalone name server; a broker embedding one
        exports its own)."""
        self.routes = routes
        self.server = server
        self._errors = RateLimiter(60_000)

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        try:
            yield from self._collect()
        except Exception as exc:  # a scrape must not crash the daemon
            log_rate_limited(self._errors, "namesrv", time.monotonic_ns() // 1_000_000, log.warning,
                             "metrics.collect_failed", part="namesrv", error=f"{type(exc).__name__}: {exc}")

    def _collect(self) -> Iterator[Metric]:
        routes = self.routes
        try:
            now_ms = int(trio.current_time() * 1000)
        except RuntimeError:  # scraped outside trio (a test rendering the registry): no ages
            now_ms = None
        per_cluster: dict[str, int] = {}
        age = GaugeMetricFamily("trimq_namesrv_broker_registration_age_seconds",
                                _doc("trimq_namesrv_broker_registration_age_seconds"),
                                labels=["cluster", "broker_name", "broker_addr"])
        for addr, live in sorted(routes.broker_live_table.items()):
            per_cluster[live.cluster] = per_cluster.get(live.cluster, 0) + 1
            if now_ms is not None:
                age.add_metric([live.cluster, live.broker_name, addr], max(0, now_ms - live.last_update_ms) / 1000)
        brokers = GaugeMetricFamily("trimq_namesrv_brokers", _doc("trimq_namesrv_brokers"), labels=["cluster"])
        for cluster in sorted(set(per_cluster) | set(routes.cluster_addr_table)):
            brokers.add_metric([cluster], per_cluster.get(cluster, 0))
        yield brokers
        yield age
        topics = GaugeMetricFamily("trimq_namesrv_topics", _doc("trimq_namesrv_topics"))
        topics.add_metric([], len(routes.topic_queue_table))
        yield topics
        clusters = GaugeMetricFamily("trimq_namesrv_clusters", _doc("trimq_namesrv_clusters"))
        clusters.add_metric([], sum(1 for names in routes.cluster_addr_table.values() if names))
        yield clusters
        server = self.server
        if server is not None:
            conns = GaugeMetricFamily("trimq_connections", _doc("trimq_connections"))
            conns.add_metric([], len(server.connections))
            yield conns
            refused = CounterMetricFamily("trimq_connections_refused", _doc("trimq_connections_refused_total"))
            refused.add_metric([], server.refused_connections)
            yield refused
            errors = CounterMetricFamily("trimq_protocol_errors", _doc("trimq_protocol_errors_total"))
            errors.add_metric([], server.protocol_errors)
            yield errors


class NamesrvMetrics:
    """A standalone name server's registry (request latency, route tables, process) and its endpoint."""

    def __init__(self, routes: RouteInfoManager, server: RemotingServer, host: str, port: int,
                 registry: CollectorRegistry | None = None) -> None:
        self.host = host
        self.port = port
        self.address: tuple[str, int] | None = None
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=False)
        self.rpc = RpcMetrics(self.registry, server)
        self.server = server
        self.registry.register(NamesrvCollector(routes, server))
        ProcessCollector(registry=self.registry)

    async def serve(self, *, task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve ``/metrics`` and ``/healthz`` (200 while the server serves) until cancelled;
        ``task_status.started((host, port))``."""
        async with trio.open_nursery() as nursery:
            serve = functools.partial(serve_metrics, self.registry, self.host, self.port,
                                      healthy=lambda: self.server.serving)
            self.address = await nursery.start(serve)
            log.info("metrics.started", daemon="namesrv", address=f"{self.address[0]}:{self.address[1]}")
            task_status.started(self.address)
