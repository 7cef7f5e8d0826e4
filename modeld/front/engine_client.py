"""The gRPC front's handle on the engine process (modeld.engine.process): start it and wait until it serves, submit and
abort requests, ask for its counts, and turn what it sends into each request's events on the front's asyncio loop.

Requests live here as modeld.request.Request objects too: the engine's chunks go into their `events` queue and
wake their stream (`wakeup`); the engine's last word on one (`final`: Request attributes by name) fills in its
finish and output before the "complete" event. Every method runs on the loop's thread, which never waits on the pipe:
what goes to the engine is
written by a thread of its own (`_write`), so the loop always reads what the engine sends, and an engine blocked on
a full pipe to the front is always drained (two processes each writing into a full pipe would wait for ever)."""

import asyncio
import itertools
import logging
import multiprocessing
import queue
import threading
from collections.abc import Callable

from modeld.config import ModeldConfig
from modeld.engine.memd_link import StartupError
from modeld.engine.process import engine_main
from modeld.request import Finish, Request

log = logging.getLogger("modeld")
ENGINE_GONE = "modeld's engine process stopped"


class EngineClient:
    def __init__(self, cfg: ModeldConfig, on_health: Callable[[bool], None]):
        """Starts the engine process and blocks until it serves; raises StartupError with its reason if it cannot.
        `on_gone`, once set, is called on the loop when the engine exits unasked (after its requests are failed)."""
        self.cfg = cfg
        self.on_health = on_health
        self.on_gone: Callable[[], None] | None = None
        self.requests: dict[str, Request] = {}  # submitted and not yet complete
        self.replies: dict[int, asyncio.Future] = {}
        self.query_ids = itertools.count()
        self.stopping = False
        self.gone = True  # the pipe ended (the engine process exited), or no engine serves yet
        self.on_metrics: Callable[[list], None] | None = None  # the engine's metric snapshots, once set
        self._start()

    def _start(self) -> None:
        """A new engine process, up to its "ready"; blocking (the model loads)."""
        context = multiprocessing.get_context("spawn")  # a fresh interpreter: no CUDA state or threads inherited
        self.conn, child_end = context.Pipe()
        self.process = context.Process(target=engine_main, args=(self.cfg, child_end), name="modeld-engine")
        self.process.start()
        child_end.close()  # the front holds one end only: the pipe ends when the engine does
        self.memd_lost = False
        while True:
            try:
                message = self.conn.recv()
            except EOFError:
                self.process.join(timeout=30)
                raise StartupError(
                    f"the engine process exited with code {self.process.exitcode} while starting"
                ) from None
            if message[0] == "ready":
                break
            if message[0] == "failed":
                self.process.join(timeout=30)
                raise StartupError(message[1])
            self._handle(message)  # memd's health, already
        _, self.info, self.vocab_size, self.context_len, self.tokenizer = message
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()  # commands for the engine, in order
        threading.Thread(target=self._write, name="modeld-engine-writer", daemon=True).start()
        self.gone = False  # only now: a request submitted while a restart starts would go to the old, dead outbox

    def restart(self) -> None:
        """After the engine exited unasked: reap its process, then start a new one (blocking, as at start); attach
        it to the loop again once this returns. StartupError if the new one cannot start."""
        assert self.gone, "restart() replaces an engine that has exited"
        self.process.join(timeout=30)  # no zombie left behind
        self.conn.close()
        self._start()

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """From now on the engine's messages are read on `loop`."""
        self.loop = loop
        loop.add_reader(self.conn.fileno(), self._read)

    # ---- the front's calls ---------------------------------------------------------------------
    def submit(self, req: Request) -> bool:
        """Queue a request (the engine must not be gone: the front checks first); False when a request with its id is
        still running."""
        if req.rid in self.requests:
            return False
        self.requests[req.rid] = req
        self.outbox.put(("add", req.rid, req.prompt_ids, req.params, req.arrived))
        return True

    def abort(self, rid: str) -> bool:
        """Abort a submitted request; False if unknown (never submitted, or already complete)."""
        if rid not in self.requests or self.gone:
            return False
        self.outbox.put(("abort", rid))
        return True

    async def counts_and_spec(self) -> tuple[int, int, dict]:
        """(running, waiting, DFLASH counters), asked of the engine now."""
        if self.gone:
            return 0, 0, {}
        qid = next(self.query_ids)
        self.replies[qid] = self.loop.create_future()
        self.outbox.put(("query", qid))
        return await self.replies[qid]

    def stop(self, timeout: float = 60) -> None:
        """Ask the engine to stop (it fails what still runs) and wait for its process; blocking."""
        self.stopping = True
        self.outbox.put(("stop",))
        self.process.join(timeout)
        if self.process.is_alive():
            log.error("the engine process did not stop in %.0f s: killed", timeout)
            self.process.kill()
            self.process.join()

    def _write(self) -> None:
        while True:
            command = self.outbox.get()
            if command is None:  # the engine is gone (_engine_gone): this writer's pipe with it
                return
            try:
                self.conn.send(command)
            except OSError:  # the engine is gone: the reader fails what was open
                return
            if command[0] == "stop":
                return

    # ---- the engine's messages ----------------------------------------------------------------
    def _read(self) -> None:
        try:
            while self.conn.poll():
                self._handle(self.conn.recv())
        except (EOFError, OSError):
            self._engine_gone()

    def _handle(self, message) -> None:
        kind = message[0]
        if kind == "out":
            for rid, chunk, final in message[1]:
                self._deliver(rid, chunk, final)
        elif kind == "dead":  # the engine thread stopped unasked: its process exits within a second
            self._engine_gone()
        elif kind == "health":
            self.memd_lost = not message[1]
            self.on_health(message[1])
        elif kind == "metrics":
            if self.on_metrics is not None:
                self.on_metrics(message[1])
        elif kind == "limits":
            _, self.info, self.context_len = message
        elif kind == "reply":
            future = self.replies.pop(message[1])
            if not future.done():
                future.set_result(message[2])

    def _deliver(self, rid: str, chunk, final) -> None:
        req = self.requests.get(rid)
        if req is None:
            return
        if chunk is not None:
            req.events.put(("chunk", *chunk))
        if final is not None:  # Request attributes by name (engine_process.final_of), `finish` among them
            for name, value in final.items():
                setattr(req, name, value)
            del self.requests[rid]
            req.events.put(("complete", req))
        if req.wakeup is not None:
            req.wakeup.set()

    def _engine_gone(self) -> None:
        """The pipe ended: the engine process exited or crashed. Every request fails; health turns NOT_SERVING."""
        if self.gone:
            return
        self.gone = True
        self.loop.remove_reader(self.conn.fileno())
        self.outbox.put(None)
        if not self.stopping:
            log.critical("%s unasked", ENGINE_GONE)
        for rid in list(self.requests):
            self._deliver(rid, None, dict(finish=Finish("abort", error_code="UNAVAILABLE", error=ENGINE_GONE)))
        for future in self.replies.values():
            if not future.done():
                future.set_result((0, 0, {}))
        self.replies.clear()
        self.on_health(False)
        if not self.stopping and self.on_gone is not None:
            self.on_gone()
