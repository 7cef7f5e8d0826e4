"""The modelds behind the gateway: one asyncio client each; their model and load, polled with GetInfo, and whether
they serve, polled with grpc.health (the standard gRPC health checking protocol).

A modeld can answer GetInfo while it cannot serve (its engine died, its memd is down): its health says NOT_SERVING
then, and only a modeld that answered SERVING at the last poll is ready to take new requests. Polling in the
background keeps `/health` and the choice of a modeld free of RPCs: both read the last poll's answers."""

import asyncio
import logging
import pathlib
import time

import client
from client.errors import ClientError
from gateway.admission import Admission
from gateway.discovery import RESOLVE_INTERVAL, Resolver, parse_name, resolve

log = logging.getLogger("gateway")
POLL_TIMEOUT = 2.0
SERVING = "SERVING"
# A modeld that reports no open-stream bound (0) is not held back: its own refusals are 429s with Retry-After.
UNREPORTED_BOUND = 1 << 30


class Backend:
    """One modeld. Its load is the larger of what it reported at the last poll (running + waiting, every client's)
    and the requests the gateway has open on it or queued for it now (exact between polls). It is ready while it
    answered both GetInfo and SERVING at the last poll, and no request has been refused UNAVAILABLE by it since.
    `admission` keeps the requests open on it within its open-stream bound and queues the rest."""

    def __init__(self, index: int, address: str, request_timeout: float, admission: Admission):
        self.index = index
        self.address = address
        self.client = client.AsyncClient(address, timeout=request_timeout, connect_timeout=2.0, max_retries=1)
        self.admission = admission
        self.model = ""  # GetInfo's target model, by its folder's name; "" until the first answer
        self.reachable = False  # GetInfo answered at the last poll
        self.health = "UNKNOWN"  # grpc.health's status at the last poll, or the status code of its failed check
        self.reported_load = 0
        self.draining = False  # its address left its DNS name: no new request, dropped once its own have ended

    @property
    def load(self) -> int:
        return max(self.reported_load, self.admission.open + self.admission.waiting)

    @property
    def ready(self) -> bool:
        return self.reachable and self.health == SERVING and not self.draining

    @property
    def idle(self) -> bool:
        return self.admission.open == 0 and self.admission.waiting == 0

    def refused_unavailable(self) -> None:
        """modeld refused a request with UNAVAILABLE: it takes no new one until a poll finds it SERVING again."""
        if self.health == SERVING:
            log.warning("modeld %s refused a request as unavailable: not ready until it answers SERVING", self.address)
            self.health = "UNAVAILABLE"

    async def poll(self) -> None:
        health, info = await asyncio.gather(self.client.health(timeout=POLL_TIMEOUT), self._info())
        if health != self.health and (health == SERVING or self.health == SERVING):
            log.log(
                logging.INFO if health == SERVING else logging.WARNING, "modeld %s: health %s", self.address, health
            )
        self.health = health
        if info is None:
            return
        if not self.reachable:
            log.info("modeld %s serves %s", self.address, model_name(info["target_model"]))
        self.model = model_name(info["target_model"])
        self.reported_load = info["running_requests"] + info["waiting_requests"]
        self.admission.set_limit(info["max_open_streams"] or UNREPORTED_BOUND)
        self.reachable = True

    async def _info(self) -> dict | None:
        try:
            return await self.client.info(timeout=POLL_TIMEOUT)
        except ClientError as exc:
            if self.reachable:
                log.warning("modeld %s is unreachable: %s", self.address, exc)
            self.reachable = False
            return None


def model_name(target_model: str) -> str:
    """The name a model is served under: its folder's (or GGUF file's) name."""
    return pathlib.Path(target_model).name


class Backends:
    """The modelds of `addresses`: fixed addresses, and DNS names (`dns:///HOST:PORT`, gateway.discovery) resolved
    again every `resolve_interval` seconds. A backend's index is never reused, so prefix affinity never follows an
    index to another modeld."""

    def __init__(
        self,
        addresses: tuple[str, ...],
        request_timeout: float,
        poll_interval: float,
        max_queued: int,
        queue_timeout: float,
        resolver: Resolver = resolve,
        resolve_interval: float = RESOLVE_INTERVAL,
    ):
        self.names = [name for name in map(parse_name, addresses) if name is not None]
        self.fixed = [address for address in addresses if parse_name(address) is None]
        self.resolver, self.resolve_interval, self.resolved_at = resolver, resolve_interval, float("-inf")
        self.new_backend = lambda index, address: Backend(
            index, address, request_timeout, Admission(max_queued, queue_timeout)
        )
        self.all = [self.new_backend(i, address) for i, address in enumerate(self.fixed)]
        self.next_index = len(self.all)
        self.poll_interval = poll_interval
        self._poller: asyncio.Task | None = None

    async def start(self) -> None:
        await self.resolve_names()
        await self.poll()
        self._poller = asyncio.create_task(self._poll_forever())

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
        for backend in self.all:
            await backend.client.close()

    async def poll(self) -> None:
        await asyncio.gather(*(backend.poll() for backend in self.all))

    async def resolve_names(self) -> None:
        """Each name resolved now: a backend for every new address (polled before it takes a request), draining for
        one whose address is gone (back to serving if it returns before it is dropped); drained ones that hold no
        request are closed and dropped."""
        if not self.names:
            return
        self.resolved_at = time.monotonic()
        found = await asyncio.gather(*(self.resolver(host, port) for host, port in self.names))
        wanted = {address for addresses in found for address in addresses} | set(self.fixed)
        present = {backend.address for backend in self.all}
        for backend in self.all:
            draining = backend.address not in wanted
            if draining != backend.draining:
                log.info("modeld %s %s its DNS name", backend.address, "left" if draining else "is back in")
            backend.draining = draining
        for address in sorted(wanted - present):
            log.info("modeld %s joined its DNS name", address)
            self.all.append(self.new_backend(self.next_index, address))
            self.next_index += 1
        for backend in [b for b in self.all if b.draining and b.idle]:
            self.all.remove(backend)
            await backend.client.close()
            log.info("modeld %s drained and dropped", backend.address)

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval)
            if self.names and time.monotonic() - self.resolved_at >= self.resolve_interval:
                await self.resolve_names()
            await self.poll()

    def models(self) -> list[str]:
        """The models served now (every reachable modeld's), each once."""
        return sorted({b.model for b in self.all if b.reachable})

    def known_model(self, model: str) -> bool:
        return any(b.model == model for b in self.all)

    def ready(self) -> list[Backend]:
        return [b for b in self.all if b.ready]

    def serving(self, model: str) -> list[Backend]:
        """The modelds that may take a new request for `model`: ready ones only."""
        return [b for b in self.ready() if b.model == model]
