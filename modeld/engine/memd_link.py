"""modeld's link to memd: the session (a lease), its mapped pools, and re-attaching when memd
comes back after being lost. Everything that holds a pool or the session is rebound on re-attach."""

import logging
import threading
import time
from typing import Callable

import grpc

from memd.attach import MemdSession
from memd.segments import SegmentError
from memd.sockets import reachable

log = logging.getLogger("modeld")


class StartupError(RuntimeError):
    """modeld cannot start (or cannot use the memd it found)."""


def map_pools(session: MemdSession) -> dict:
    """The session's pools mapped; StartupError naming the segment if one is missing or short (never garbage)."""
    try:
        return session.map()
    except SegmentError as exc:
        raise StartupError(f"cannot map memd's pools: {exc}") from None


class MemdLink:
    def __init__(self, address: str, connect_timeout: float, on_health: Callable[[bool], None], writes_draft_kv: bool):
        self.address = address
        self.connect_timeout = connect_timeout
        self.writes_draft_kv = writes_draft_kv  # told to memd: prefixes cached without it keep no draft KV
        self.model_fingerprint = ""  # told to memd from identify() on: its prefix cache is kept per model
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
            except grpc.RpcError as exc:  # memd refuses the session: shutting down (tried again until the deadline)
                if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    raise StartupError(
                        f"memd at {address} refused the session: {exc.code().name}: {exc.details()}"
                    ) from None
                time.sleep(0.5)
        try:
            self.pools = map_pools(self.session)
        except StartupError:
            self.session.close()
            raise

    def _attach(self, timeout: float) -> MemdSession:
        return MemdSession(
            self.address,
            "modeld",
            connect_timeout=timeout,
            writes_draft_kv=self.writes_draft_kv,
            model_fingerprint=self.model_fingerprint,
        )

    def identify(self, fingerprint: str) -> None:
        """Name the loaded model to memd (modeld.model.fingerprint): the session is replaced by one attached with the
        fingerprint, which every re-attach sends too. The first session only told modeld the layout to load the
        model for and held nothing; its pools stay mapped unless memd made new ones meanwhile (then start-up checks
        the new layout)."""
        self.model_fingerprint = fingerprint
        # Only a prefix: the whole fingerprint is what joins this model's prefix cache in memd, and memd shows none
        # of it
        log.info("model fingerprint %s...", fingerprint[:8])
        try:
            session = self._attach(self.connect_timeout)
        except grpc.FutureTimeoutError:
            raise StartupError(f"memd does not answer at {self.address}") from None
        if session.layout.epoch != self.layout.epoch:
            try:
                self.pools = map_pools(session)
            except StartupError:
                session.close()
                raise
        old, self.session = self.session, session
        old.close()

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
            except grpc.RpcError as exc:  # something answers but refuses the session: memd still shutting down, say
                log.warning(
                    "memd at %s refused the session (%s: %s): trying again",
                    self.address,
                    exc.code().name,
                    exc.details(),
                )
                stopped.wait(0.5 if exc.code() == grpc.StatusCode.UNAVAILABLE else 5.0)
                continue
            try:
                self.check(session.layout)
                pools = map_pools(session)  # a failed map leaves health NOT_SERVING and the attempt retried
            except StartupError as exc:
                log.error("memd is back with pools modeld cannot use: %s", exc)
                session.close()
                stopped.wait(5.0)
                continue
            old, self.session, self.pools = self.session, session, pools
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
