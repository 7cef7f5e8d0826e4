"""memd's process: plan the pools, create them, serve gRPC, and clean up on SIGTERM/SIGINT/SIGHUP.

Clean-up invariant: from the moment memd creates a shared segment or its socket, every exit but SIGKILL removes them:
the stop signals are caught before anything is created (StopSignals), and what serve() creates is removed in its
`finally`; a socket memd did not bind (another daemon's) is never removed. Segments a SIGKILL leaves behind are
removed by the next memd's start-up sweep (memd.segments: by their lock, not by the pid in their name)."""

import asyncio
import logging
import os
import secrets
import signal
import sys

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from memd.buffers import CUDA_DEVICE, CudaBuffers, ShmBuffers
from memd.config import MemdConfig, config_from_args
from memd.limits import max_request_bytes
from memd.metrics import RpcTimer, observe_rpc, start_metrics
from memd.parse_guard import AsyncParseGuard
from memd.plan import ConfigError, PoolPlan, log_plan, make_plan
from memd.pools import build_pools
from memd.segments import remove_stale_segments
from memd.service import MemdService
from memd.sockets import MAX_MESSAGE_BYTES, listen
from protos import memd_pb2, memd_pb2_grpc

log = logging.getLogger("memd")
SERVICE_NAME = memd_pb2.DESCRIPTOR.services_by_name["Memd"].full_name
EXIT_INVARIANT = 70
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
KEEPALIVE_OPTIONS = [
    # Find a silent dead peer (no FIN, e.g. a frozen host) within ~2 s so its lease ends.
    ("grpc.keepalive_time_ms", 1000),
    ("grpc.keepalive_timeout_ms", 1000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]


def server_options(plan: PoolPlan) -> list[tuple[str, int]]:
    """What memd receives is bounded by its plan (memd.limits); what it sends, by what its clients receive."""
    receive = max_request_bytes(plan.max_running_requests, plan.context_len)
    return [
        ("grpc.max_receive_message_length", receive),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        *KEEPALIVE_OPTIONS,
    ]


class StopSignals:
    """The stop signals, caught from before memd creates anything. Until serve() hands them to its event loop they
    are only remembered: one that comes while memd creates its segments or socket stops it right after, through the
    same clean-up as any other stop."""

    def __init__(self):
        self.received = False
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._remember)

    def _remember(self, signum, frame) -> None:
        self.received = True

    def to_loop(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, stop.set)
        if self.received:
            stop.set()


def make_buffers(cfg: MemdConfig, epoch: int):
    if cfg.device == "cuda":
        return CudaBuffers(CUDA_DEVICE)
    return ShmBuffers(f"memd-{os.getpid()}-{epoch:016x}")


async def serve(cfg: MemdConfig, plan: PoolPlan, stop_signals: StopSignals) -> int:
    stop = asyncio.Event()
    stop_signals.to_loop(stop)
    epoch = secrets.randbits(63)
    buffers = make_buffers(cfg, epoch)
    sock = None  # the Unix socket memd bound: removed on the way out
    exit_code = 0

    def fatal(message: str) -> None:
        nonlocal exit_code
        exit_code = EXIT_INVARIANT
        stop.set()

    try:
        mgr, layout = build_pools(plan, buffers, epoch)
        timer = [RpcTimer()] if cfg.metrics_port is not None else []
        server = grpc.aio.server(interceptors=[AsyncParseGuard(), *timer], options=server_options(plan))
        service = MemdService(mgr, buffers, layout, cfg.strict, fatal)
        if cfg.metrics_port is not None:
            service.observe = observe_rpc
        memd_pb2_grpc.add_MemdServicer_to_server(service, server)
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        reflection.enable_server_reflection([SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
        if cfg.metrics_port is not None:  # before the socket: a port in use ends memd with one line, nothing bound
            start_metrics(cfg.metrics_host, cfg.metrics_port, service, asyncio.get_running_loop())
        port, sock = listen(server, cfg.listen, cfg.allow_group)
        if sock is None:
            log.warning(
                "memd listens on TCP: there is no peer check, anyone who reaches the port can attach and call "
                "(a Unix socket admits only memd's user, root and --allow-group)"
            )
        await server.start()
        for name in ("", SERVICE_NAME):
            await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        bound = cfg.listen if sock is not None else f"{cfg.listen.rsplit(':', 1)[0]}:{port}"
        shared = f", group {cfg.allow_group} allowed" if cfg.allow_group is not None else ""
        log.info("memd ready: listening on %s (%s, strict=%s%s)", bound, buffers.backend, cfg.strict, shared)
        await stop.wait()
        log.info("memd shutting down")
        for name in ("", SERVICE_NAME):
            await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await service.notify_shutdown("memd is shutting down" if exit_code == 0 else "memd invariant violated")
        await server.stop(grace=2.0)
    finally:
        buffers.close()
        if sock is not None:
            sock.unlink(missing_ok=True)
    log.info("memd stopped; shared segments released")
    return exit_code


def main(argv: list[str] | None = None) -> None:
    try:
        cfg = config_from_args(argv)
    except ValueError as exc:
        sys.exit(f"memd: error: {exc}")
    stop_signals = StopSignals()  # before anything is created
    logging.basicConfig(level=cfg.log_level, format="%(asctime)s memd %(levelname)s %(message)s", stream=sys.stderr)
    for name in remove_stale_segments():
        log.warning("removed stale shared segment /dev/shm/%s", name)
    try:
        plan = make_plan(cfg)
        log_plan(plan)
        code = asyncio.run(serve(cfg, plan, stop_signals))
    except (ConfigError, MemoryError) as exc:
        sys.exit(f"memd: error: {exc}")
    sys.exit(code)
