"""How many requests the gateway has open on one modeld, and the bounded queue in front of it.

A modeld refuses Generate streams beyond its bound (`--max-open-streams`, which GetInfo reports) with
RESOURCE_EXHAUSTED. The gateway keeps at most that many open on it, and holds the next ones in a first-come,
first-served queue of at most `max_waiting` requests, each for at most `max_wait` seconds; past either bound the
request is refused (429) with a Retry-After estimated from how long requests have recently held their place.

The queue is bounded, where vLLM's is not, because a waiting request holds its parsed body (up to --max-body-bytes)
and its client's connection: an unbounded queue turns a burst into memory growth and answers that come too late to
be useful, where a prompt 429 with Retry-After lets the client (the openai package retries on it) come back.
"""

import asyncio
import math
from collections import deque

# A request's time holding its place, the Retry-After estimate's unit: an exponential average, starting here.
FIRST_HOLD_SECONDS = 2.0
HOLD_AVERAGE_WEIGHT = 0.1  # of the newest request in the average
MAX_RETRY_AFTER = 60  # seconds: longer estimates are no more useful to a client


class QueueFull(Exception):
    def __init__(self, message: str, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after


class Admission:
    """At most `limit` open requests; up to `max_waiting` more wait, in order, at most `max_wait` seconds each."""

    def __init__(self, max_waiting: int, max_wait: float):
        self.max_waiting, self.max_wait = max_waiting, max_wait
        self.limit = 0  # modeld's open-stream bound, from its GetInfo (0 until the first answer: nothing is admitted)
        self.open = 0
        self.waiters: deque[asyncio.Future] = deque()
        self.mean_hold = FIRST_HOLD_SECONDS

    @property
    def waiting(self) -> int:
        return sum(not f.done() for f in self.waiters)

    def set_limit(self, limit: int) -> None:
        self.limit = limit
        self._grant()

    def retry_after(self) -> int:
        """Seconds until a place is likely free: the queue ahead, drained `limit` at a time, one hold each."""
        rounds = (self.waiting + 1) / max(self.limit, 1)
        return min(MAX_RETRY_AFTER, max(1, math.ceil(rounds * self.mean_hold)))

    async def enter(self) -> None:
        """Take a place, waiting in the queue if none is free; QueueFull when the queue is full or the wait runs out.
        Cancelled while waiting (the client left), it leaves the queue and holds nothing."""
        if self.open < self.limit and not self.waiting:
            self.open += 1
            return
        if self.waiting >= self.max_waiting:
            raise QueueFull(
                f"the modeld's {self.limit} places and its queue of {self.max_waiting} are full", self.retry_after()
            )
        place = asyncio.get_running_loop().create_future()
        self.waiters.append(place)
        try:
            await asyncio.wait_for(place, self.max_wait)
        except BaseException as exc:
            self._forget(place)
            if place.done() and not place.cancelled():  # granted just as the wait ended: the place goes on
                self.open -= 1
                self._grant()
            if isinstance(exc, TimeoutError):
                raise QueueFull(
                    f"no place freed on the modeld within {self.max_wait:g} s", self.retry_after()
                ) from None
            raise

    def leave(self, held_seconds: float) -> None:
        """A request that entered ends, after holding its place this long."""
        self.open -= 1
        self.mean_hold += HOLD_AVERAGE_WEIGHT * (held_seconds - self.mean_hold)
        self._grant()

    def _forget(self, place: asyncio.Future) -> None:
        try:
            self.waiters.remove(place)
        except ValueError:
            pass

    def _grant(self) -> None:
        while self.open < self.limit and self.waiters:
            place = self.waiters.popleft()
            if not place.done():
                place.set_result(None)
                self.open += 1
