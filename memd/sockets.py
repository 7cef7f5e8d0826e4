"""Daemon sockets: owner-only Unix sockets (from the moment they exist), no stealing a live daemon's socket,
reachability."""

import os
import pathlib
import socket

from memd.addresses import unix_path
from memd.plan import ConfigError

# memd's clients, and what memd's server sends: slot lists of long prefills exceed gRPC's 4 MiB default. What the
# servers receive is bounded by each daemon's limits (memd.limits, modeld.limits).
MAX_MESSAGE_BYTES = 256 << 20
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]


def reachable(address: str) -> bool:
    """Whether something accepts connections at a unix:// or host:port address (a plain socket, no gRPC)."""
    path = unix_path(address)
    try:
        if path is not None:
            with socket.socket(socket.AF_UNIX) as probe:
                probe.connect(str(path))
        else:
            host, port = address.rsplit(":", 1)
            socket.create_connection((host.strip("[]"), int(port)), timeout=0.5).close()
    except OSError:
        return False
    return True


def listen(server, address: str) -> tuple[int, pathlib.Path | None]:
    """Bind a gRPC server (sync or asyncio) to `address`: the port (TCP) and the Unix socket now ours to remove.
    The socket is made under umask 0177, so it is owner-only (0600) from the moment it exists."""
    path = unix_path(address)
    if path is not None:
        prepare_socket(path)
    umask = os.umask(0o177)
    try:
        port = server.add_insecure_port(address)
    except RuntimeError:
        raise ConfigError(f"cannot listen on {address}: the address is in use, not permitted or does not resolve "
                          "(gRPC's reason is on the line above)") from None
    finally:
        os.umask(umask)
    return port, path


def prepare_socket(path: pathlib.Path) -> None:
    """Owner-only parent folder; a leftover socket of a dead daemon is removed, a live one refused."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not path.exists():
        return
    if reachable(f"unix://{path}"):
        raise ConfigError(f"another process listens on {path}")
    path.unlink()
