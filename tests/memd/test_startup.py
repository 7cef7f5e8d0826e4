"""memd's start and stop: its socket is owner-only from the moment it exists; a stop signal at any moment of the
start leaves no socket and no shared segment behind; a second memd on a live memd's socket leaves it alone; a bad
--listen is one line of error, for both daemons."""

import os
import pathlib
import signal
import stat
import subprocess
import sys
import tempfile
import time
from concurrent import futures

import grpc
import pytest

from memd.sockets import listen
from tests.daemons import REPO, child_env, memd_args, run_memd, start_daemon, stop_daemon
from tests.models import tiny_target


@pytest.fixture
def target(tmp_path):
    return tiny_target(tmp_path / "t")


@pytest.fixture
def folder():
    return pathlib.Path(tempfile.mkdtemp(prefix="memd-start-", dir="/tmp"))


def segments(pid: int) -> list[pathlib.Path]:
    return list(pathlib.Path("/dev/shm").glob(f"memd-{pid}-*"))


def start_memd(target, folder: pathlib.Path, umask: int | None = None) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "memd",
        "--device",
        "cpu",
        "--target-model",
        str(target),
        "--listen",
        f"unix://{folder / 'memd.sock'}",
        *memd_args(),
    ]
    old = os.umask(umask) if umask is not None else None  # the child inherits it
    try:
        return start_daemon(cmd, folder / "memd.log")
    finally:
        if old is not None:
            os.umask(old)


def wait_for(condition, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    """Busy-wait (no sleep: a moment of memd's start lasts milliseconds) until condition() or memd exits."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"memd exited with {proc.returncode} before the moment came"
        assert time.monotonic() < deadline, "the moment never came"


def test_the_socket_is_owner_only_from_the_moment_it_exists(target, folder):
    sock = folder / "memd.sock"
    proc = start_memd(target, folder, umask=0)  # a umask that would leave the socket open to everyone
    try:
        mode = None
        deadline = time.monotonic() + 60
        while mode is None:
            try:
                mode = stat.S_IMODE(os.stat(sock).st_mode)  # the first moment it is seen
            except FileNotFoundError:
                assert proc.poll() is None and time.monotonic() < deadline, (folder / "memd.log").read_text()
        assert mode == 0o600
    finally:
        stop_daemon(proc, timeout=10)


def test_listen_binds_a_unix_socket_owner_only_for_either_daemon(folder):
    """modeld binds through the same helper (a sync gRPC server; memd's is asyncio)."""
    server = grpc.server(futures.ThreadPoolExecutor(1))
    old = os.umask(0)
    try:
        _, path = listen(server, f"unix://{folder / 'modeld.sock'}")
    finally:
        os.umask(old)
    assert os.umask(old) == old  # the process umask is back
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # before the server even starts
    server.stop(0)


MOMENTS = {
    "at once": lambda proc, sock: True,
    "first segment": lambda proc, sock: bool(segments(proc.pid)),
    "socket": lambda proc, sock: sock.exists(),
}


@pytest.mark.parametrize(
    "sig,moment",
    [(signal.SIGTERM, m) for m in MOMENTS] + [(signal.SIGINT, "first segment"), (signal.SIGHUP, "first segment")],
)
def test_a_stop_signal_during_start_leaves_nothing(target, folder, sig, moment):
    sock = folder / "memd.sock"
    proc = start_memd(target, folder)
    try:
        wait_for(lambda: MOMENTS[moment](proc, sock), proc)
        proc.send_signal(sig)
        code = proc.wait(timeout=30)
        log = (folder / "memd.log").read_text()
        # Killed before main() caught the signals (nothing was created yet), or stopped cleanly.
        assert code == 0 or (moment == "at once" and code == -sig), log
        assert segments(proc.pid) == [], log
        assert not sock.exists(), log
    finally:
        stop_daemon(proc, timeout=10)
        for leftover in segments(proc.pid):
            leftover.unlink()


def test_a_second_memd_on_a_live_socket_refuses_and_leaves_it_alone(target):
    with run_memd(target, *memd_args()) as first:
        sock = pathlib.Path(first.address[len("unix://") :])
        second = subprocess.run(
            [
                sys.executable,
                "-m",
                "memd",
                "--device",
                "cpu",
                "--target-model",
                str(target),
                "--listen",
                first.address,
                *memd_args(),
            ],
            capture_output=True,
            text=True,
            env=child_env(),
            cwd=REPO,
            timeout=60,
        )
        assert second.returncode == 1
        assert second.stderr.splitlines()[-1] == f"memd: error: another process listens on {sock}"
        assert sock.exists() and first.capacity().target.total > 0  # the first memd still serves


@pytest.mark.parametrize(
    "daemon,address,message",
    [
        ("memd", "bogus", "--listen 'bogus': give unix:///path/to/socket or HOST:PORT (e.g. 127.0.0.1:50051)"),
        ("memd", "127.0.0.1:99999", "--listen '127.0.0.1:99999': port 99999 is outside 0..65535"),
        ("modeld", "bogus", "--listen 'bogus': give unix:///path/to/socket or HOST:PORT (e.g. 127.0.0.1:50051)"),
    ],
)
def test_a_bad_listen_address_is_one_line_of_error(daemon, address, message):
    proc = subprocess.run(
        [sys.executable, "-m", daemon, "--device", "cpu", "--listen", address],
        capture_output=True,
        text=True,
        env=child_env(),
        cwd=REPO,
        timeout=60,
    )
    assert proc.returncode == 1
    assert proc.stderr == f"{daemon}: error: {message}\n"
