"""modeld's link to memd: the session (a lease), its mapped pools, and re-attaching when memd
comes back after being lost. Everything that holds a pool or the session is rebound on re-attach."""

import logging
import threading
import time
from typing import Callable

import grpc

from memd.attach import MemdSession
from memd.sockets import reachable

log = logging.getLogger("modeld")


class StartupError(RuntimeError):
    """modeld cannot start (or cannot use the memd it found)."""


class MemdLink:
    def __init__(self, address: str, connect_timeout: float, on_health: Callable[[bool], None],
                 writes_draft_kv: bool):
        self.address = address
        self.writes_draft_kv = writes_draft_kv  # told to memd: prefixes cached without it keep no draft KV
        self.on_health = on_health  # called with False when the session is lost, True when re-attached
        self.check: Callable = lambda layout: None  # raises StartupError for a layout modeld cannot use
        self.rebinders: list[Callable[[MemdSession, dict], None]] = []
        self.closing = False
        deadline = time.monotonic() + connect_timeout
        while True:
            try:
                self.session = self._attach(max(1.0, min(5.0, deadline - time.monotonic())))
                break
            except grpc.FutureTimeoutError:
                if time.monotonic() > deadline:
                    raise StartupError(f"memd does not answer at {address}") from None
        self.pools = self.session.map()

    def _attach(self, timeout: float) -> MemdSession:
        return MemdSession(self.address, "modeld", connect_timeout=timeout, writes_draft_kv=self.writes_draft_kv)

    @property
    def layout(self):
        return self.session.layout

    @property
    def lost(self) -> bool:
        return self.session.lost.is_set()

    def start_watching(self) -> None:
        session = self.session

        def watch() -> None:
            session.lost.wait()
            if not self.closing and session is self.session:
                log.error("memd session lost: %s", session.shutdown_reason or "connection closed")
                self.on_health(False)

        threading.Thread(target=watch, daemon=True, name="memd-watch").start()

    def reattach(self, stopped: threading.Event) -> bool:
        """Block until memd answers again with pools modeld can use (or until `stopped`); then
        rebind every holder of the session or the pools. The old session's slots died with it."""
        while not stopped.is_set():
            if not reachable(self.address):  # probe with a plain socket: no gRPC channel per attempt
                stopped.wait(0.5)
                continue
            try:
                session = self._attach(5.0)
            except grpc.FutureTimeoutError:
                continue
            try:
                self.check(session.layout)
            except StartupError as exc:
                log.error("memd is back with pools modeld cannot use: %s", exc)
                session.close()
                stopped.wait(5.0)
                continue
            old, self.session, self.pools = self.session, session, session.map()
            old.close()
            for rebind in self.rebinders:
                rebind(session, self.pools)
            self.start_watching()
            self.on_health(True)
            log.info("re-attached to memd (layout epoch %d)", session.layout.epoch)
            return True
        return False

    def close(self) -> None:
        self.closing = True
        self.session.close()
