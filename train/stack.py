"""Start memd and modeld as child processes (for bulk generation and benchmarks; not a test helper).

    with run_memd(target, *memd_args(...), device="cuda") as memd:
        with run_modeld(memd, "--target-model", str(target), device="cuda") as modeld:
            ... client.Client(modeld.address) ...

Both listen on Unix sockets in a fresh owner-only folder under the temp dir; they are stopped with
SIGTERM (SIGKILL after a grace period) when the block ends. Their logs stay in that folder.
"""

import contextlib
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parent.parent


class Daemon:
    def __init__(self, proc: subprocess.Popen, address: str, log_path: pathlib.Path):
        self.proc, self.address, self.log_path = proc, address, log_path

    def log(self) -> str:
        return self.log_path.read_text()


def child_env() -> dict:
    """The environment for a child: the repository ahead of any PYTHONPATH."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


def start(cmd: list[str], log_path: pathlib.Path, extra_env: dict[str, str] | None = None) -> subprocess.Popen:
    with open(log_path, "w") as log:
        env = {**child_env(), **(extra_env or {})}
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)


def wait_ready(proc: subprocess.Popen, log_path: pathlib.Path, marker: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while marker not in log_path.read_text():
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[2]} exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{proc.args[2]} did not start:\n{log_path.read_text()[-4000:]}")
        time.sleep(0.05)


def stop(proc: subprocess.Popen, timeout: float) -> None:
    """SIGTERM (a clean shutdown), SIGKILL if it does not stop in time."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def memd_args(
    *,
    draft: pathlib.Path | None = None,
    ratio: float = 1.0,
    window: int | None = None,
    page: int = 1,
    budget: int = 4_000_000,
    max_running: int = 4,
    chunk: int = 64,
    strict: bool = False,
    lookahead: int | None = None,
) -> list[str]:
    """memd's command-line arguments for the common settings (lookahead None: memd's default)."""
    args = [
        "--page-size",
        str(page),
        "--max-running-requests",
        str(max_running),
        "--kv-budget-bytes",
        str(budget),
        "--chunked-prefill-size",
        str(chunk),
        "--draft-model",
        str(draft) if draft else "none",
        "--draft-kv-ratio",
        str(ratio),
    ]
    if window is not None:
        args += ["--draft-window", str(window)]
    if lookahead is not None:
        args += ["--decode-lookahead", str(lookahead)]
    if strict:
        args.append("--strict")
    return args


@contextlib.contextmanager
def run_memd(target: pathlib.Path, *args: str, device: str = "cpu", ready_timeout: float = 120):
    folder = pathlib.Path(tempfile.mkdtemp(prefix="memd-"))
    address = f"unix://{folder / 'memd.sock'}"
    log_path = folder / "memd.log"
    proc = start(
        [sys.executable, "-m", "memd", "--device", device, "--target-model", str(target), "--listen", address, *args],
        log_path,
    )
    try:
        wait_ready(proc, log_path, "memd ready", ready_timeout)
        yield Daemon(proc, address, log_path)
    finally:
        stop(proc, timeout=10)


@contextlib.contextmanager
def run_modeld(memd: Daemon, *args: str, device: str = "cpu", ready_timeout: float = 300):
    """modeld attached to `memd`, on a Unix socket beside memd's."""
    folder = pathlib.Path(memd.address[len("unix://") :]).parent
    address = f"unix://{folder / 'modeld.sock'}"
    log_path = folder / "modeld.log"
    proc = start(
        [sys.executable, "-m", "modeld", "--device", device, "--memd", memd.address, "--listen", address, *args],
        log_path,
    )
    try:
        wait_ready(proc, log_path, "modeld ready", ready_timeout)
        yield Daemon(proc, address, log_path)
    finally:
        stop(proc, timeout=30)
