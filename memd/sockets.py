"""Daemon sockets: owner-only Unix sockets (from the moment they exist), optionally shared with one group, no
stealing a live daemon's socket, reachability.

Who may call a daemon on a Unix socket is decided here, by the kernel, at connect(): that needs write permission on
the socket file and search permission on its folder. grpcio cannot check the peer itself: it never reads the peer's
credentials (SO_PEERCRED) of a Unix-socket connection, and a servicer's auth_context holds only the transport's
security type, with insecure and with local (UDS) credentials alike. So the socket's mode is the peer check: 0600
(its owner's uid, and root), or 0660 with a group given (`group`) whose members may call too."""

import os
import pathlib
import socket
import stat

from memd.addresses import unix_path
from memd.plan import ConfigError

# memd's clients, and what memd's server sends: slot lists of long prefills exceed gRPC's 4 MiB default. What the
# servers receive is bounded by each daemon's limits (memd.limits, modeld.front.limits).
MAX_MESSAGE_BYTES = 256 << 20
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
]


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


def listen(server, address: str, group: int | None = None) -> tuple[int, pathlib.Path | None]:
    """Bind a gRPC server (sync or asyncio) to `address`: the port (TCP) and the Unix socket now ours to remove.
    The socket is made under umask 0177, so it is owner-only (0600) from the moment it exists; with `group` (a gid)
    it is then given to that group and made 0660 (never open to anyone else on the way)."""
    path = unix_path(address)
    if path is not None:
        prepare_socket(path, group)
    umask = os.umask(0o177)
    try:
        port = server.add_insecure_port(address)
    except RuntimeError:
        raise ConfigError(
            f"cannot listen on {address}: the address is in use, not permitted or does not resolve "
            "(gRPC's reason is on the line above)"
        ) from None
    finally:
        os.umask(umask)
    if path is not None and group is not None:
        try:
            _give_to_group(path, group)
        except ConfigError:
            path.unlink(missing_ok=True)  # bound but not handed back to be removed: remove it here
            raise
        os.chmod(path, 0o660)
    return port, path


def check_can_listen(address: str) -> None:
    """Before a slow start (modeld's engine loads the model and captures its graphs first), whether `address` could
    be listened on now: a live daemon's socket or a TCP port another process listens on is refused with ConfigError,
    a dead daemon's socket removed (listen() binds for real afterwards; the check only makes a taken address fail
    at once, not after the start)."""
    path = unix_path(address)
    if path is not None:
        prepare_socket(path)
        return
    host, _, port = address.rpartition(":")
    if int(port) == 0:
        return
    try:
        with socket.create_server((host.strip("[]"), int(port))):
            pass
    except OSError as exc:
        raise ConfigError(f"cannot listen on {address}: {exc.strerror or exc}") from None


def prepare_socket(path: pathlib.Path, group: int | None = None) -> None:
    """The parent folder: made owner-only (with `group`: 0710, searchable by the group), or, if it exists and a group
    is given, searchable by it; a leftover socket of a dead daemon is removed, a live one refused."""
    try:
        path.parent.mkdir(mode=0o700, parents=True)
        if group is not None:
            _give_to_group(path.parent, group)
            os.chmod(path.parent, 0o710)
    except FileExistsError:
        if group is not None and not _searchable_by(path.parent, group):
            raise ConfigError(
                f"group {group} cannot reach a socket in {path.parent} (the folder is not searchable by "
                "it): give the folder that group and g+x, or listen in a new folder"
            ) from None
    if not path.exists():
        return
    if reachable(f"unix://{path}"):
        raise ConfigError(f"another process listens on {path}")
    path.unlink()


def _give_to_group(path: pathlib.Path, group: int) -> None:
    try:
        os.chown(path, -1, group)
    except PermissionError:
        raise ConfigError(f"cannot give {path} to group {group}: the daemon's user is not a member of it") from None


def _searchable_by(folder: pathlib.Path, group: int) -> bool:
    """Whether members of `group` may pass through `folder` (its own mode only, not its parents')."""
    st = folder.stat()
    return bool(st.st_mode & stat.S_IXOTH) or (st.st_gid == group and bool(st.st_mode & stat.S_IXGRP))
