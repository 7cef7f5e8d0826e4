"""modeld's /metrics, served by the front (opt-in: `--metrics-port`) from the last snapshot the engine process sent
(modeld.engine.metrics: every SNAPSHOT_INTERVAL_S), plus what only the front knows: the engine restarts. The endpoint is
bound before the engine starts and outlives engine restarts (a restarted engine's counters start again from zero,
which Prometheus reads as a counter reset)."""

import logging

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger("modeld")


class FrontMetrics(Collector):
    def __init__(self):
        self.families: list = []  # the engine's last snapshot
        self.engine_restarts = 0

    def collect(self):
        yield from self.families
        yield CounterMetricFamily(
            "modeld:engine_restarts",
            "Engine processes the front restarted after one exited unasked (modeld.front.engine_supervisor)",
            value=self.engine_restarts,
        )


def serve_metrics(host: str, port: int) -> FrontMetrics:
    """/metrics on host:port (0: any free port), from a thread of the front; OSError when the port is taken."""
    metrics, registry = FrontMetrics(), CollectorRegistry()
    registry.register(metrics)
    server, _ = start_http_server(port, addr=host, registry=registry)
    log.info("modeld metrics on http://%s:%d/metrics", host, server.server_port)
    return metrics
