"""Daemon addresses: owner-only Unix socket folders, no stealing a live daemon's socket, reachability."""

import pathlib
import socket

from memd.plan import ConfigError

# Slot lists of long prefills exceed gRPC's 4 MiB default; memd's and modeld's servers and memd's clients agree.
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 256 << 20), ("grpc.max_send_message_length", 256 << 20)]

def unix_path(address: str) -> pathlib.Path | None:
    if address.startswith("unix://"):
        return pathlib.Path(address[len("unix://"):])
    if address.startswith("unix:"):
        return pathlib.Path(address[len("unix:"):])
    return None


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


def prepare_socket(path: pathlib.Path) -> None:
    """Owner-only parent folder; a leftover socket of a dead daemon is removed, a live one refused."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not path.exists():
        return
    if reachable(f"unix://{path}"):
        raise ConfigError(f"another process listens on {path}")
    path.unlink()
