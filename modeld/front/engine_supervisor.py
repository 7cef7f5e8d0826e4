"""What the front does when its engine process exits unasked (a crash, the kernel's OOM killer, a kill -9): the
engine client has already failed every open stream with UNAVAILABLE and turned health NOT_SERVING; the supervisor
starts a new engine after a backoff (1 s, then doubling up to 30 s), which attaches to memd afresh, loads the model
and captures its graphs, and health turns SERVING again. An engine that keeps dying is not restarted for ever: past
MAX_RESTARTS restarts within RESTART_WINDOW_S the front stops and exits 1, so that whatever runs it (a container's
restart policy, systemd, Kubernetes) takes over with a fresh process. A restart that fails to start counts as one.
"""

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable

from modeld.engine.memd_link import StartupError
from modeld.front.engine_client import EngineClient
from modeld.front.metrics import FrontMetrics

log = logging.getLogger("modeld")
MAX_RESTARTS = 3  # restarts within the window the front makes; one more death and it exits 1
RESTART_WINDOW_S = 600.0
FIRST_BACKOFF_S, MAX_BACKOFF_S = 1.0, 30.0


class EngineSupervisor:
    def __init__(
        self,
        engine: EngineClient,
        on_serving: Callable[[bool], Awaitable[None]],
        stop: asyncio.Event,
        metrics: FrontMetrics | None,
    ):
        """on_serving: sets the front's health; stop: set to stop the front (also when the supervisor gives up);
        metrics: the front's, which count the restarts (None without --metrics-port)."""
        self.engine, self.on_serving, self.stop, self.metrics = engine, on_serving, stop, metrics
        self.restarts: deque[float] = deque()  # when each restart of the window began
        self.gave_up = False  # the front exits 1
        self.recovering: asyncio.Task | None = None
        self.starting = False  # a new engine process is starting (a thread waits for its "ready")
        engine.on_gone = self.engine_gone

    def engine_gone(self) -> None:
        """The engine exited unasked (on the loop, after its requests were failed)."""
        if self.recovering is None or self.recovering.done():
            self.recovering = asyncio.get_running_loop().create_task(self._recover())

    def backoff(self) -> float:
        return min(MAX_BACKOFF_S, FIRST_BACKOFF_S * 2 ** len(self.restarts))

    async def _recover(self) -> None:
        await asyncio.to_thread(self.engine.process.join, 5)  # reaped (no zombie), and its exit code known
        code = self.engine.process.exitcode
        while not self.stop.is_set():
            now = time.monotonic()
            while self.restarts and now - self.restarts[0] > RESTART_WINDOW_S:
                self.restarts.popleft()
            if len(self.restarts) >= MAX_RESTARTS:
                log.critical(
                    "the engine process exited unasked (code %s) after %d restarts within %.0f s: modeld "
                    "stops, exit status 1",
                    code,
                    len(self.restarts),
                    RESTART_WINDOW_S,
                )
                self.gave_up = True
                self.stop.set()
                return
            delay = self.backoff()
            self.restarts.append(now)
            log.error(
                "the engine process exited unasked (code %s): restart %d of at most %d within %.0f s, in %.0f s",
                code,
                len(self.restarts),
                MAX_RESTARTS,
                RESTART_WINDOW_S,
                delay,
            )
            await asyncio.sleep(delay)
            if self.stop.is_set():
                return
            self.starting = True
            try:
                await asyncio.to_thread(self.engine.restart)
            except StartupError as exc:
                log.error("the engine did not start again: %s", exc)
                code = self.engine.process.exitcode
                continue
            finally:
                self.starting = False
            self.engine.attach(asyncio.get_running_loop())
            if self.metrics is not None:
                self.metrics.engine_restarts += 1
            await self.on_serving(not self.engine.memd_lost)
            log.info("the engine process serves again (restart %d)", len(self.restarts))
            return

    async def close(self) -> None:
        """Before the front stops its engine: a backoff is cut short; an engine starting is waited for, so that the
        engine the front stops is the one that runs."""
        if self.recovering is None or self.recovering.done():
            return
        if not self.starting:
            self.recovering.cancel()
        await asyncio.gather(self.recovering, return_exceptions=True)
