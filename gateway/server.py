"""The gateway's process: bind the HTTP socket, serve the app with uvicorn until SIGTERM / SIGINT."""

import logging
import socket
import sys

import uvicorn

from gateway.app import create_app
from gateway.config import GatewayConfig, config_from_args

log = logging.getLogger("gateway")


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound here so that port 0 (any free port) can be logged as the port it became."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family)


def serve(cfg: GatewayConfig) -> None:
    sock = bind(cfg.host, cfg.port)
    host, port = sock.getsockname()[:2]
    log.info("gateway listening on http://%s:%d", f"[{host}]" if ":" in host else host, port)
    config = uvicorn.Config(create_app(cfg), log_level=cfg.log_level.lower(), access_log=False)
    uvicorn.Server(config).run(sockets=[sock])


def main(argv=None) -> None:
    try:
        cfg = config_from_args(argv)
    except ValueError as exc:
        sys.exit(f"gateway: error: {exc}")
    logging.basicConfig(level=cfg.log_level, format="%(asctime)s gateway %(levelname)s %(message)s", stream=sys.stderr)
    try:
        serve(cfg)
    except OSError as exc:
        sys.exit(f"gateway: error: cannot listen on {cfg.host}:{cfg.port}: {exc}")
