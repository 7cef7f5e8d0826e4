"""modeld: the gRPC front (this process) and the engine (its own process, modeld.engine.process: attach to memd, load
the target, run steps; modeld.engine.build wires it). The front imports neither torch nor the model code. Stops
cleanly on SIGTERM/SIGINT/SIGHUP."""

import asyncio
import logging
import os
import signal
import sys

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from memd.parse_guard import AsyncParseGuard
from memd.plan import ConfigError
from memd.sockets import check_can_listen, listen
from modeld.config import ModeldConfig, config_from_args
from modeld.engine.memd_link import StartupError
from modeld.front.engine_client import EngineClient
from modeld.front.engine_supervisor import EngineSupervisor
from modeld.front.limits import MAX_REQUEST_BYTES
from modeld.front.metrics import FrontMetrics, serve_metrics
from modeld.front.service import ModeldService
from modeld.front.stream_limit import StreamLimit
from protos import modeld_pb2, modeld_pb2_grpc

log = logging.getLogger("modeld")
SERVICE_NAME = modeld_pb2.DESCRIPTOR.services_by_name["Modeld"].full_name
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
SERVER_OPTIONS = [("grpc.max_receive_message_length", MAX_REQUEST_BYTES)]


def serve(cfg: ModeldConfig) -> int:
    return asyncio.run(_serve(cfg))


async def _serve(cfg: ModeldConfig) -> int:
    """The gRPC front (grpc.aio: every handler on this loop) over the engine process, until a stop signal."""
    loop = asyncio.get_running_loop()
    health_servicer = health.aio.HealthServicer()

    async def set_statuses(serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", SERVICE_NAME):
            await health_servicer.set(name, status)

    check_can_listen(cfg.listen)  # a taken address fails now, not after the engine's start (and holding memd)
    metrics = front_metrics(cfg)  # the same: a taken metrics port fails before the engine starts
    # Health changes come on the loop, or from the thread that waits for a restarted engine: handed over thread-safely.
    engine = EngineClient(cfg, lambda serving: loop.call_soon_threadsafe(loop.create_task, set_statuses(serving)))
    engine.attach(loop)  # the constructor blocked until the engine served
    if metrics is not None:
        engine.on_metrics = lambda families: setattr(metrics, "families", families)
    max_open_streams = cfg.max_open_streams or 4 * engine.info["max_running_requests"]
    service = ModeldService(engine, cfg.memd, max_open_streams)
    streams = StreamLimit(f"/{SERVICE_NAME}/Generate", max_open_streams)
    server = grpc.aio.server(interceptors=[AsyncParseGuard(), streams], options=SERVER_OPTIONS)
    modeld_pb2_grpc.add_ModeldServicer_to_server(service, server)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection([SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
    stop = asyncio.Event()
    supervisor = EngineSupervisor(engine, set_statuses, stop, metrics)  # restarts an engine that exits unasked
    for sig in STOP_SIGNALS:  # before the socket exists: from here every stop goes through the clean-up below
        loop.add_signal_handler(sig, stop.set)
    sock = None
    try:
        port, sock = listen(server, cfg.listen)  # inside: a bind that fails still stops the engine below
        await server.start()
        await set_statuses(not engine.memd_lost)
        bound = cfg.listen if sock else f"{cfg.listen.rsplit(':', 1)[0]}:{port}"
        log.info("modeld ready: listening on %s (%s, %s, memd %s)", bound, cfg.device, engine.info["dtype"], cfg.memd)
        await stop.wait()
        log.info("modeld shutting down")
        await set_statuses(False)
        await server.stop(grace=5)
    finally:
        service.prepare.shutdown(wait=False, cancel_futures=True)
        await supervisor.close()
        await asyncio.to_thread(engine.stop)  # the engine fails what still runs and closes memd's session
        if sock is not None:
            sock.unlink(missing_ok=True)
    log.info("modeld stopped")
    return 1 if supervisor.gave_up else 0


def front_metrics(cfg: ModeldConfig) -> FrontMetrics | None:
    """The front's /metrics endpoint, when asked for (--metrics-port)."""
    if cfg.metrics_port is None:
        return None
    try:
        return serve_metrics(cfg.metrics_host, cfg.metrics_port, cfg.memd)
    except OSError as exc:
        raise StartupError(f"cannot serve metrics on {cfg.metrics_host}:{cfg.metrics_port}: {exc}") from None


def main(argv=None) -> None:
    try:
        cfg = config_from_args(argv)
    except ValueError as exc:
        sys.exit(f"modeld: error: {exc}")
    logging.basicConfig(level=cfg.log_level, format="%(asctime)s modeld %(levelname)s %(message)s", stream=sys.stderr)
    try:
        code = serve(cfg)
    except (StartupError, ConfigError, FileNotFoundError, ValueError) as exc:
        sys.exit(f"modeld: error: {exc}")
    # serve() has stopped the server, joined the engine and closed memd's session. Leave now: letting the
    # interpreter finalise gRPC's channels while their C-core threads wind down sometimes aborts the
    # process ("terminate called without an active exception"), seen after a re-attach to memd.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
