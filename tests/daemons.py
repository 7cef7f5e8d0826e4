"""Start memd as a separate process for tests, and check its pools are free at the end."""

import contextlib
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time

import grpc

from client.memd_admin import all_free, is_idle
from memd.defaults import default_draft_dir
from protos import memd_pb2, memd_pb2_grpc
from train import stack
from train.stack import start as start_daemon  # noqa: F401 (tests import them here)
from train.stack import stop as stop_daemon
from train.stack import wait_ready

REPO = pathlib.Path(__file__).resolve().parent.parent


class MemdProcess:
    def __init__(self, proc: subprocess.Popen, address: str, log_path: pathlib.Path):
        self.proc, self.address, self.log_path = proc, address, log_path
        self.channel = grpc.insecure_channel(address)
        self.stub = memd_pb2_grpc.MemdStub(self.channel)

    def log(self) -> str:
        return self.log_path.read_text()

    def capacity(self) -> memd_pb2.CapacityResponse:
        return self.stub.Capacity(memd_pb2.CapacityRequest(), timeout=5)

    def wait_all_free(self, timeout: float = 3.0) -> memd_pb2.CapacityResponse:
        """Poll until no slot is held (leases end asynchronously); return the last answer."""
        deadline = time.monotonic() + timeout
        while True:
            cap = self.capacity()
            if all_free(cap) or time.monotonic() > deadline:
                return cap

    def wait_idle(self, timeout: float = 3.0) -> memd_pb2.CapacityResponse:
        """Poll until no request holds anything: every slot is free or in the prefix cache,
        unprotected (leases end and releases ride on later calls, asynchronously)."""
        deadline = time.monotonic() + timeout
        while True:
            cap = self.capacity()
            if is_idle(cap) or time.monotonic() > deadline:
                return cap
            time.sleep(0.01)

    def flush_and_wait_free(self, timeout: float = 3.0) -> memd_pb2.CapacityResponse:
        """Wait until idle, drop the prefix cache, then wait_all_free: the pools are free at the
        end of a test that cached prefixes."""
        self.wait_idle(timeout)
        self.stub.FlushCache(memd_pb2.FlushCacheRequest(), timeout=5)
        return self.wait_all_free(timeout)

    def assert_idle_then_flush(self, timeout: float = 3.0) -> memd_pb2.CapacityResponse:
        """The end-of-test check: nothing held but by the prefix cache; after FlushCache both
        pools fully free. Returns the idle answer (before the flush)."""
        idle = self.wait_idle(timeout)
        assert is_idle(idle), f"memd's pools are not free or cached: {idle}"
        self.stub.FlushCache(memd_pb2.FlushCacheRequest(), timeout=5)
        cap = self.wait_all_free(timeout)
        pools = [("target", cap.target)] + ([("draft", cap.draft)] if cap.has_draft else [])
        busy = [f"{side} free {p.free}/{p.total}" for side, p in pools if p.free != p.total]
        assert not busy, f"memd's pools not free after FlushCache: {busy}"
        return idle

    def shm_entries(self) -> list[str]:
        return [p.name for p in pathlib.Path("/dev/shm").glob(f"memd-{self.proc.pid}-*")]


def child_env(*paths: str) -> dict:
    """The environment for a child process: the repository (and `paths`) ahead of any PYTHONPATH."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), *paths, os.environ.get("PYTHONPATH")])),
    }


@contextlib.contextmanager
def run_memd(
    target: pathlib.Path,
    *args: str,
    device: str = "cpu",
    check_free: bool = True,
    ready_timeout: float = 60,
    address: str | None = None,
):
    """memd on a Unix socket in a fresh owner-only folder (or at `address`); stopped with SIGTERM afterwards.
    Unless check_free is False, the test ends by asserting that nothing is held but by the prefix cache,
    and that FlushCache then leaves both pools fully free."""
    folder = pathlib.Path(tempfile.mkdtemp(prefix="memd-", dir="/tmp"))
    address = address or f"unix://{folder / 'memd.sock'}"
    log_path = folder / "memd.log"
    cmd = [sys.executable, "-m", "memd", "--device", device, "--target-model", str(target), "--listen", address, *args]
    proc = start_daemon(cmd, log_path)
    memd = MemdProcess(proc, address, log_path)
    try:
        wait_ready(proc, log_path, "memd ready", ready_timeout)
        yield memd
        if check_free and proc.poll() is None:
            memd.assert_idle_then_flush()
    finally:
        memd.channel.close()
        stop_daemon(proc, timeout=10)


def link_to_a_stopped_memd(target: pathlib.Path, health: list[bool]):
    """modeld's MemdLink (health reports into `health`) attached to a memd that then stopped on SIGTERM: the link's
    session is lost, and memd's address is free for the next one. Returns (link, address)."""
    from modeld.engine.memd_link import MemdLink

    with run_memd(target, *memd_args(), check_free=False) as first:
        link = MemdLink(first.address, 10, health.append, writes_draft_kv=False)
        first.proc.send_signal(signal.SIGTERM)
        assert first.proc.wait(timeout=10) == 0
    assert link.session.lost.wait(10)
    return link, first.address


def memd_args(**settings) -> list[str]:
    """train.stack.memd_args, strict unless told otherwise: tests check memd's invariants after every call."""
    return stack.memd_args(**{"strict": True, **settings})


def shipped_draft_memd_args(budget: int, max_running: int, chunk: int) -> list[str]:
    """memd for the shipped draft on the CPU: its bounded pool (ratio 0.25, its window 256, page 64), fp32 KV."""
    return memd_args(
        draft=default_draft_dir(), ratio=0.25, window=256, page=64, budget=budget, max_running=max_running, chunk=chunk
    ) + ["--kv-cache-dtype", "float32"]


def shipped_draft_flags(block: int | None = None) -> list[str]:
    """modeld's flags to serve the shipped draft (at its own block size unless `block`)."""
    return ["--draft-model", str(default_draft_dir())] + (["--num-draft-tokens", str(block)] if block else [])


@contextlib.contextmanager
def run_modeld(
    memd: MemdProcess,
    *args: str,
    device: str = "cpu",
    ready_timeout: float = 180,
    name: str = "modeld",
    tuning: str = "",
):
    """modeld attached to `memd`, on a Unix socket beside memd's (`name`.sock, log `name`.log: give each of several
    modelds on one memd its own name), with MODELD_TUNING set to `tuning`; stopped with SIGTERM afterwards."""
    folder = pathlib.Path(memd.address[len("unix://") :]).parent
    address = f"unix://{folder / f'{name}.sock'}"
    log_path = folder / f"{name}.log"
    cmd = [sys.executable, "-m", "modeld", "--device", device, "--memd", memd.address, "--listen", address, *args]
    proc = start_daemon(cmd, log_path, {"MODELD_TUNING": tuning})
    try:
        wait_ready(proc, log_path, "modeld ready", ready_timeout)
        proc.address, proc.log_path = address, log_path
        yield proc
    finally:
        stop_daemon(proc, timeout=30)
