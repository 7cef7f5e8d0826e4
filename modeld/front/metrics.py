"""modeld's /metrics, served by the front (opt-in: `--metrics-port`) from the last snapshot the engine process sent
(modeld.engine.metrics: every SNAPSHOT_INTERVAL_S), plus what only the front knows: the engine restarts, and the KV
usage of memd's target pool, asked of memd at scrape time. So one endpoint per replica holds what an endpoint picker
reads (the Gateway API Inference Extension's: queue, running requests, KV usage), under vLLM's names with a
`modeld:` prefix. The endpoint is bound before the engine starts and outlives engine restarts (a restarted engine's
counters start again from zero, which Prometheus reads as a counter reset)."""

import logging

import grpc
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from protos import memd_pb2, memd_pb2_grpc

log = logging.getLogger("modeld")
CAPACITY_TIMEOUT = 1.0  # seconds a scrape waits for memd; past it the KV gauges are left out of that scrape


class MemdPools:
    """memd's Capacity, asked from the metrics thread over a channel of its own."""

    def __init__(self, address: str):
        self.stub = memd_pb2_grpc.MemdStub(grpc.insecure_channel(address))

    def target(self) -> memd_pb2.PoolCapacity | None:
        try:
            return self.stub.Capacity(memd_pb2.CapacityRequest(), timeout=CAPACITY_TIMEOUT).target
        except grpc.RpcError as exc:
            log.debug("no KV usage for this scrape: memd answered %s", exc.code().name)
            return None


class FrontMetrics(Collector):
    def __init__(self, pools: MemdPools | None = None):
        self.families: list = []  # the engine's last snapshot
        self.engine_restarts = 0
        self.pools = pools

    def collect(self):
        yield from self.families
        yield CounterMetricFamily(
            "modeld:engine_restarts",
            "Engine processes the front restarted after one exited unasked (modeld.front.engine_supervisor)",
            value=self.engine_restarts,
        )
        target = self.pools.target() if self.pools is not None else None
        if target is not None and target.total:
            yield from kv_usage(target)


def kv_usage(target: memd_pb2.PoolCapacity):
    """As vLLM counts it: KV that requests hold (their own pages and the cached pages they lock) over the pool; a
    cached page no request uses is free, since memd evicts it on demand."""
    used = target.held_by_requests + target.protected
    yield GaugeMetricFamily(
        "modeld:kv_cache_usage_perc",
        "Share of memd's target KV pool that requests hold (1 = full)",
        value=used / target.total,
    )
    tokens = GaugeMetricFamily("modeld:kv_cache_tokens", "memd's target KV pool in tokens", labels=["state"])
    tokens.add_metric(["used"], used)
    tokens.add_metric(["total"], target.total)
    yield tokens


def serve_metrics(host: str, port: int, memd: str | None = None) -> FrontMetrics:
    """/metrics on host:port (0: any free port), from a thread of the front, with the KV usage of the memd at `memd`;
    OSError when the port is taken."""
    metrics, registry = FrontMetrics(MemdPools(memd) if memd else None), CollectorRegistry()
    registry.register(metrics)
    server, _ = start_http_server(port, addr=host, registry=registry)
    log.info("modeld metrics on http://%s:%d/metrics", host, server.server_port)
    return metrics
