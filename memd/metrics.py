"""memd's Prometheus metrics (opt-in: `--metrics-port`), named as vLLM names its own with a `memd:` prefix.

Pool gauges are read at scrape time from the Capacity answer, computed on memd's event loop (the only thread that
touches allocator state), so nothing is counted on the allocation path for them. RPC calls are timed by a server
interceptor; evictions are counted where the allocator evicts (memd.slots)."""

import asyncio
import logging
import time

import grpc
from prometheus_client import REGISTRY, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from memd.plan import ConfigError
from protos import memd_pb2

log = logging.getLogger("memd")
SCRAPE_TIMEOUT = 2.0
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)

RPC_DURATION = Histogram(
    "memd:rpc_duration_seconds",
    "Time to answer one call, a unary RPC or a call of a Calls stream (count: the calls)",
    ["method"],
    buckets=LATENCY_BUCKETS,
)
RPC_ERRORS = Counter("memd:rpc_errors_total", "Calls answered with an error, by gRPC status", ["method", "code"])
EVICTED_TOKENS = Counter(
    "memd:prefix_cache_evicted_tokens_total",
    "Cached tokens evicted to make room for an allocation, per side (target: the prefix and its "
    "draft KV; draft: the draft KV only)",
    ["side"],
)


def observe_rpc(method: str, seconds: float, code: grpc.StatusCode | None) -> None:
    """One answered call: a unary RPC, or a call of a Calls stream (counted under its own method's name)."""
    RPC_DURATION.labels(method).observe(seconds)
    if code not in (None, grpc.StatusCode.OK):
        RPC_ERRORS.labels(method, code.name).inc()


class RpcTimer(grpc.aio.ServerInterceptor):
    """Times every unary RPC and counts its error codes (Attach, a stream that lasts a session, is left out; a Calls
    stream times its calls itself, through MemdService.observe)."""

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        method = handler_call_details.method.rsplit("/", 1)[-1]
        inner = handler.unary_unary

        async def timed(request, context):
            start = time.perf_counter()
            try:
                return await inner(request, context)
            finally:
                observe_rpc(method, time.perf_counter() - start, context.code())

        return grpc.unary_unary_rpc_method_handler(timed, handler.request_deserializer, handler.response_serializer)


class PoolCollector(Collector):
    """Pool, draft and session gauges from one Capacity answer per scrape."""

    def __init__(self, service, loop: asyncio.AbstractEventLoop):
        self.service, self.loop = service, loop

    def describe(self):
        """The families without samples: registering must not wait for the loop (memd registers from it)."""
        return list(families(None))

    def collect(self):
        capacity = asyncio.run_coroutine_threadsafe(
            self.service.Capacity(memd_pb2.CapacityRequest(), None), self.loop
        ).result(SCRAPE_TIMEOUT)
        return families(capacity)


def families(capacity: memd_pb2.CapacityResponse | None):
    """The gauges of one Capacity answer (None: the families alone)."""
    tokens = GaugeMetricFamily(
        "memd:kv_cache_tokens",
        "KV tokens of a pool by state (total = free + held + evictable + protected)",
        labels=["pool", "state"],
    )
    usage = GaugeMetricFamily(
        "memd:kv_cache_usage_perc",
        "Fraction of a pool not free (0..1; the prefix cache counts as used)",
        labels=["pool"],
    )
    scalars = {
        "memd:draft_kv_ratio": (
            "Draft KV pool size over the target's (0: no draft pool)",
            lambda c: c.draft_kv_ratio if c.has_draft else 0.0,
        ),
        "memd:draft_window_tokens": ("Draft KV window kept per request (0: unbounded)", lambda c: c.draft_window),
        "memd:sessions": ("Attached client sessions", lambda c: c.sessions),
        "memd:num_requests_running": ("Requests holding a row", lambda c: c.running_requests),
    }
    if capacity is not None:
        pools = [("target", capacity.target)] + ([("draft", capacity.draft)] if capacity.has_draft else [])
        for name, pool in pools:
            for state in ("total", "free", "held_by_requests", "evictable", "protected"):
                tokens.add_metric([name, state.removesuffix("_by_requests")], getattr(pool, state))
            usage.add_metric([name], (pool.total - pool.free) / pool.total if pool.total else 0.0)
    yield tokens
    yield usage
    for name, (documentation, read) in scalars.items():
        yield GaugeMetricFamily(name, documentation, value=None if capacity is None else read(capacity))


def start_metrics(host: str, port: int, service, loop: asyncio.AbstractEventLoop) -> int:
    """Serve /metrics on host:port (0: any free port) from a thread; returns the port."""
    try:
        server, _ = start_http_server(port, addr=host)
    except OSError as exc:  # a port in use, an address not of this host
        raise ConfigError(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}") from None
    REGISTRY.register(PoolCollector(service, loop))
    bound = server.server_port
    log.info("memd metrics on http://%s:%d/metrics", host, bound)
    return bound
