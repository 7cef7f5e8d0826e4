"""memd as a child process of a benchmark, on a Unix socket in a fresh folder; stopped with SIGTERM afterwards."""

import contextlib
import pathlib
import subprocess
import sys
import tempfile
import time

from memd.sockets import reachable


@contextlib.contextmanager
def memd_process(*memd_args: str, start_timeout: float = 120):
    """Yields memd's address once it answers; `memd_args` are memd's flags besides --listen."""
    folder = pathlib.Path(tempfile.mkdtemp(prefix="bench-memd-"))
    address = f"unix://{folder / 'memd.sock'}"
    with open(folder / "memd.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "memd", "--listen", address, *memd_args], stdout=log, stderr=subprocess.STDOUT
        )
        try:
            deadline = time.monotonic() + start_timeout
            while not reachable(address):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"memd did not start:\n{(folder / 'memd.log').read_text()}")
                time.sleep(0.1)
            yield address
        finally:
            proc.terminate()
            proc.wait(timeout=30)
