"""The gateway as a separate process for tests, in front of modelds started by tests.daemons."""

import contextlib
import pathlib
import re
import sys
import tempfile

from tests.daemons import start_daemon, stop_daemon, wait_ready

LISTENING = re.compile(r"gateway listening on (http://\S+)")


@contextlib.contextmanager
def run_gateway(*modeld_addresses: str, args: tuple[str, ...] = (), ready_timeout: float = 60):
    """`python -m gateway` on a free loopback port; yields its base URL; stopped with SIGTERM afterwards."""
    log_path = pathlib.Path(tempfile.mkdtemp(prefix="gateway-", dir="/tmp")) / "gateway.log"
    modelds = [part for address in modeld_addresses for part in ("--modeld", address)]
    cmd = [sys.executable, "-m", "gateway", *modelds, "--port", "0", "--poll-interval", "0.1", *args]
    proc = start_daemon(cmd, log_path)
    try:
        wait_ready(proc, log_path, "gateway ready", ready_timeout)
        yield LISTENING.search(log_path.read_text()).group(1)
    finally:
        stop_daemon(proc, timeout=10)
