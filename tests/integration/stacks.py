"""The deployment under test, two ways with one interface: memd, modeld and the gateway as plain processes, or
as the containers of compose.yaml + compose.cpu.yaml (podman-compose, the README's commands). They listen on
loopback TCP ports picked free here; the client reaches them exactly as a user would."""

import json
import os
import pathlib
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time

from tests.daemons import REPO, MemdProcess, child_env

# The same memd flags for both stacks (strict: every mutating call checks memd's invariants).
MEMD_ARGS = ["--strict"]
COMPOSE_FILES = ["-f", "compose.yaml", "-f", "compose.cpu.yaml"]
CONTAINERS_CONF = pathlib.Path(__file__).resolve().parent / "containers.conf"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def probe(address: str) -> tuple[int, str]:
    """The image's health probe, run here: (exit status, its line)."""
    out = subprocess.run(
        [sys.executable, "-m", "client.probe", address],
        capture_output=True,
        text=True,
        env=child_env(),
        cwd=REPO,
        timeout=30,
    )
    return out.returncode, out.stdout.strip()


def wait_until(predicate, timeout: float, what: str, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout} s")
        time.sleep(interval)


class Stack:
    """memd + modeld (+ the gateway in front of modeld). Subclasses start, kill and stop them."""

    kind = ""

    def __init__(self):
        self.memd_port, self.modeld_port, self.gateway_port = free_port(), free_port(), free_port()
        self.gateway_url = f"http://127.0.0.1:{self.gateway_port}"
        self.memd_address = f"127.0.0.1:{self.memd_port}"
        self.modeld_address = f"127.0.0.1:{self.modeld_port}"
        self.memd: MemdProcess | None = None  # capacity and the end-of-test check, over gRPC

    def serving(self, address: str) -> bool:
        return probe(address)[0] == 0

    def wait_serving(self, timeout: float = 240) -> None:
        for address in (self.memd_address, self.modeld_address):
            wait_until(lambda: self.serving(address), timeout, f"{address} SERVING", interval=0.5)

    def attach_memd_client(self, log_path: pathlib.Path) -> None:
        self.memd = MemdProcess(None, self.memd_address, log_path)

    # Implemented per stack.
    def start(self) -> None: ...
    def kill_modeld(self) -> None: ...
    def start_modeld(self) -> None: ...
    def stop_memd(self) -> None: ...
    def start_memd(self) -> None: ...
    def stop(self) -> dict[str, int]: ...
    def memd_segments(self) -> list[str]: ...
    def logs(self) -> str: ...
    def close(self) -> None: ...


class ProcessStack(Stack):
    kind = "processes"

    def __init__(self, model: pathlib.Path):
        super().__init__()
        self.model = model
        self.folder = pathlib.Path(tempfile.mkdtemp(prefix="dflash-it-"))
        self.procs: dict[str, subprocess.Popen] = {}

    def _spawn(self, name: str, cmd: list[str]) -> None:
        log = open(self.folder / f"{name}.log", "a")
        self.procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env(), cwd=REPO)
        log.close()

    def _start_memd(self) -> None:
        self._spawn(
            "memd",
            [
                sys.executable,
                "-m",
                "memd",
                "--device",
                "cpu",
                "--target-model",
                str(self.model),
                "--listen",
                self.memd_address,
                *MEMD_ARGS,
            ],
        )

    def start_modeld(self) -> None:
        self._spawn(
            "modeld",
            [
                sys.executable,
                "-m",
                "modeld",
                "--device",
                "cpu",
                "--target-model",
                str(self.model),
                "--memd",
                self.memd_address,
                "--listen",
                self.modeld_address,
            ],
        )
        self.wait_serving()

    def start(self) -> None:
        self._start_memd()
        self.attach_memd_client(self.folder / "memd.log")
        self.start_modeld()
        self._spawn(
            "gateway",
            [sys.executable, "-m", "gateway", "--modeld", self.modeld_address, "--port", str(self.gateway_port)],
        )

    def kill_modeld(self) -> None:
        self.procs["modeld"].send_signal(signal.SIGKILL)
        self.procs["modeld"].wait()

    def stop_memd(self) -> None:
        proc = self.procs["memd"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0

    def start_memd(self) -> None:
        self._start_memd()

    def stop(self) -> dict[str, int]:
        codes = {}
        for name in ("modeld", "memd"):
            proc = self.procs[name]
            proc.send_signal(signal.SIGTERM)
            codes[name] = proc.wait(timeout=30)
        return codes

    def memd_segments(self) -> list[str]:
        pid = self.procs["memd"].pid
        return sorted(p.name for p in pathlib.Path("/dev/shm").glob(f"memd-{pid}-*"))

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-4000:]}" for p in sorted(self.folder.glob("*.log")))

    def close(self) -> None:
        if self.memd is not None:
            self.memd.channel.close()
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def podman_env() -> dict:
    """podman's settings for these machines (runc, ulimits, the host network) unless the caller set its own."""
    env = dict(os.environ)
    env.setdefault("CONTAINERS_CONF", str(CONTAINERS_CONF))
    return env


def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    out = subprocess.run(["podman", *args], capture_output=True, text=True, env=podman_env(), timeout=timeout)
    if check and out.returncode != 0:
        raise RuntimeError(f"podman {shlex.join(args)} exited with {out.returncode}:\n{out.stdout}\n{out.stderr}")
    return out


def podman_compose_command() -> list[str]:
    """podman-compose as installed beside this Python (pip), else on PATH."""
    try:
        import podman_compose  # noqa: F401

        return [sys.executable, "-m", "podman_compose"]
    except ImportError:
        return ["podman-compose"]


class ContainerStack(Stack):
    """compose.yaml + compose.cpu.yaml under podman-compose, the commands of the README's CPU section:
    `up model` converts the default model into the project's named volume (once), then `up -d --no-deps`."""

    kind = "containers"

    def __init__(self, image: str):
        super().__init__()
        self.project = f"dflash-it-{os.getpid()}-{self.memd_port}"
        self.env = {
            **podman_env(),
            "DFLASH_PROJECT": self.project,
            "DFLASH_IMAGE": image,
            "MEMD_PORT": str(self.memd_port),
            "MODELD_PORT": str(self.modeld_port),
            "GATEWAY_PORT": str(self.gateway_port),
            "MEMD_ARGS": shlex.join(MEMD_ARGS),
            "MODELD_ARGS": "",
        }
        self.folder = pathlib.Path(tempfile.mkdtemp(prefix="dflash-it-"))

    def compose(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
        cmd = [*podman_compose_command(), *COMPOSE_FILES, *args]
        out = subprocess.run(cmd, capture_output=True, text=True, env=self.env, cwd=REPO, timeout=timeout)
        with open(self.folder / "compose.log", "a") as log:
            log.write(f"$ {shlex.join(cmd)}\n{out.stdout}{out.stderr}\nexit {out.returncode}\n")
        if out.returncode != 0:
            raise RuntimeError(
                f"{shlex.join(cmd)} exited with {out.returncode}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
            )
        return out

    def container(self, service: str) -> str:
        return f"{self.project}_{service}_1"

    def start(self) -> None:
        self.compose("up", "--no-build", "model")  # attached: returns when the conversion has finished
        state = self.inspect("model")
        assert state["ExitCode"] == 0, f"the model service failed:\n{self.logs()}"
        self.compose("up", "-d", "--no-build", "--no-deps")
        self.attach_memd_client(self.folder / "compose.log")
        self.wait_serving()

    def inspect(self, service: str) -> dict:
        return json.loads(podman("inspect", "--format", "{{json .State}}", self.container(service)).stdout)

    def kill_modeld(self) -> None:
        podman("kill", "--signal", "KILL", self.container("modeld"))
        wait_until(lambda: not self.inspect("modeld")["Running"], 30, "modeld's container stopped")

    def start_modeld(self) -> None:
        podman("start", self.container("modeld"))
        self.wait_serving()

    def stop_memd(self) -> None:
        podman("stop", "--time", "30", self.container("memd"))
        assert self.inspect("memd")["ExitCode"] == 0

    def start_memd(self) -> None:
        podman("start", self.container("memd"))

    def stop(self) -> dict[str, int]:
        codes = {}
        for service in ("modeld", "memd"):  # `podman stop`: SIGTERM, SIGKILL only after the grace period
            podman("stop", "--time", "30", self.container(service))
            codes[service] = self.inspect(service)["ExitCode"]
        return codes

    def memd_segments(self) -> list[str]:
        """/dev/shm of the namespaces memd and modeld share, as seen from `ns` (which keeps running)."""
        out = podman("exec", self.container("ns"), "ls", "-A", "/dev/shm")
        return sorted(name for name in out.stdout.split() if name.startswith("memd-"))

    def healthcheck(self, service: str) -> int:
        """compose.yaml's health check of a service, run once by podman (without systemd nothing schedules it)."""
        return podman("healthcheck", "run", self.container(service), check=False).returncode

    def logs(self) -> str:
        parts = []
        for service in ("model", "memd", "modeld", "gateway"):
            out = podman("logs", "--tail", "40", self.container(service), check=False)
            parts.append(f"--- {service}\n{out.stdout}{out.stderr}")
        return "\n".join(parts)

    def close(self) -> None:
        if self.memd is not None:
            self.memd.channel.close()
        if os.environ.get("DFLASH_IT_KEEP") == "1":  # debugging: leave the stack up
            return
        try:
            self.compose("down", "-v", "-t", "10", timeout=300)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            print(f"compose down failed: {exc}", file=sys.stderr)
