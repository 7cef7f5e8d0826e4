"""The form of a daemon address: unix:PATH / unix://PATH, or HOST:PORT."""

import pathlib


def unix_path(address: str) -> pathlib.Path | None:
    if address.startswith("unix://"):
        return pathlib.Path(address[len("unix://") :])
    if address.startswith("unix:"):
        return pathlib.Path(address[len("unix:") :])
    return None


def check_address(flag: str, address: str, listening: bool) -> None:
    """unix:PATH or unix://PATH (an absolute PATH when listening), or HOST:PORT with a port in 1..65535 (0 too when
    listening: any free port);
    ValueError naming the flag otherwise (gRPC would take a port modulo 65536, or fail to bind with a traceback)."""
    path = unix_path(address)
    if path is not None:
        if not str(path):
            raise ValueError(f"{flag} {address!r}: the Unix socket path is empty")
        if listening and not path.is_absolute():  # relative to whatever folder the daemon was started in
            raise ValueError(
                f"{flag} {address!r}: a socket to listen on needs an absolute path (unix:///path/to/socket)"
            )
        return
    host, _, port = address.rpartition(":")
    if not host or not (port.isascii() and port.isdigit()):
        raise ValueError(f"{flag} {address!r}: give unix:///path/to/socket or HOST:PORT (e.g. 127.0.0.1:50051)")
    lowest = 0 if listening else 1
    if not lowest <= int(port) <= 65535:
        raise ValueError(f"{flag} {address!r}: port {int(port)} is outside {lowest}..65535")
