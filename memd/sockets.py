"""Unix socket addresses: owner-only folders, and no stealing a live daemon's socket."""

import pathlib
import socket

from memd.plan import ConfigError


def unix_path(address: str) -> pathlib.Path | None:
    if address.startswith("unix://"):
        return pathlib.Path(address[len("unix://"):])
    if address.startswith("unix:"):
        return pathlib.Path(address[len("unix:"):])
    return None


def prepare_socket(path: pathlib.Path) -> None:
    """Owner-only parent folder; a leftover socket of a dead daemon is removed, a live one refused."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not path.exists():
        return
    probe = socket.socket(socket.AF_UNIX)
    try:
        probe.connect(str(path))
    except OSError:
        path.unlink()
        return
    finally:
        probe.close()
    raise ConfigError(f"another process listens on {path}")
