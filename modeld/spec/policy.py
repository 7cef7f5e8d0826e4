"""When DFLASH pays: each step, verify blocks or decode plainly, whichever is expected to commit more tokens a second.

Two estimates meet in the decision, both measured while serving:
  - acceptance: per request, a running mean of the tokens a verify step commits (its first token and the accepted
    drafts), started from the running mean over all requests (a new request has no history of its own);
  - cost: per batch bucket (a power of two, as the graphs pad) and kind of batch (greedy, or any request sampling:
    sampled verify steps accept less and run one a replay), a running mean of the seconds a step takes with each
    option, from the engine's own passes that only decode. That is the cost the choice changes, host work, memd
    calls and the overlap of plain steps included, and on the CPU it is the CPU's.
Verify wins when sum(expected tokens of each request) / verify cost > requests / plain cost.

Warm-up: the first verify steps teach the acceptance; each new bucket then runs plain steps until it has
MIN_SAMPLES of them, and verify next only where it could win even at the bound of its cost that smaller buckets of
the same kind give (a draft that accepts next to nothing never verifies a large batch to learn that it loses). An
option that loses is tried again for a short burst after `interval` passes. A burst that confirms the choice at least
doubles the interval, and stretches it until the burst's loss is EXPLORATION_SHARE of the time between bursts (up to
REEXPLORE_MAX passes); one that flips the choice starts it over. A weak draft then costs a few verify steps in a
thousand, and a change in acceptance or load is still seen within REEXPLORE_MAX passes.
The first pass of a burst and of any switch is not a sample: it ends the other option's pipeline (a plain decode
queued ahead) or starts its own.

Every option is lossless (verify commits only what the target would have produced; a plain step is the target's),
so the policy changes speed, never tokens.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field

from modeld.request import Request

EWMA = 0.1  # weight of a new sample in every running mean: about the last 20 samples count
PRIOR_WEIGHT = 2.0  # a request's own mean counts as this many samples of the global one when it has none
MIN_SAMPLES = 2  # plain samples a bucket takes before it compares; of each option for its ratio to bound others
BURST = 2  # passes an exploration runs the losing option (its first pass is not a sample)
REEXPLORE_FROM = 32  # passes between explorations after a flip
REEXPLORE_MAX = 1024
EXPLORATION_SHARE = 0.01  # after a burst that confirms the choice, explore again once its loss is this share of time


@dataclass
class RunningMean:
    value: float = 0.0
    count: int = 0

    def add(self, sample: float) -> None:
        self.count += 1
        # the plain mean until 1/EWMA samples, then exponential: early samples do not dominate
        weight = max(EWMA, 1.0 / self.count)
        self.value += weight * (sample - self.value)


@dataclass
class BucketCosts:
    """Seconds a step for one bucket, per option (True: verify), and the bucket's exploration state."""

    seconds: dict[bool, RunningMean] = field(default_factory=lambda: {True: RunningMean(), False: RunningMean()})
    exploring: bool | None = None  # the option a burst runs, None when not exploring
    burst_left: int = 0
    since: int = 0  # passes since the last exploration
    interval: int = REEXPLORE_FROM


def bucket_of(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


class SpeculationPolicy:
    def __init__(self):
        self.accept = RunningMean(value=1.0)  # tokens a verify step commits, over every request
        self.per_request: dict[str, RunningMean] = {}
        self.costs: dict[tuple[int, bool], BucketCosts] = {}
        self.last: bool | None = None  # the option the last decode pass ran

    # ---- the decision ------------------------------------------------------------------------------------------
    def speculate(self, running: Sequence[Request]) -> bool:
        """Whether this step's decodes verify blocks. Pure: asked again before the step runs, it answers alike."""
        if not running:
            return True
        if self.accept.count == 0:
            return True  # nothing is known of the draft yet: its verify steps teach it
        key = self._key(running)
        bucket = self._bucket(key)
        if bucket.exploring is not None:
            return bucket.exploring
        plain = bucket.seconds[False]
        if plain.count < MIN_SAMPLES:
            return False  # plain first: cheap to measure, and the verify cost's bound below is a multiple of it
        return self._verify_wins(running, self._verify_seconds(key, bucket), plain.value)

    def expected_tokens(self, req: Request) -> float:
        """Tokens one verify step is expected to commit for `req` (1 to the block size)."""
        own = self.per_request.get(req.rid)
        if own is None or own.count == 0:
            return self.accept.value
        weight = own.count / (own.count + PRIOR_WEIGHT)
        return weight * own.value + (1 - weight) * self.accept.value

    def _verify_wins(self, running: Sequence[Request], verify_seconds: float, plain_seconds: float) -> bool:
        rates = self._rates(running, verify_seconds, plain_seconds)
        return rates[True] > rates[False]

    def _rates(self, running: Sequence[Request], verify_seconds: float, plain_seconds: float) -> dict[bool, float]:
        """Tokens a second the batch is expected to commit verifying (True) and decoding plainly (False)."""
        expected = sum(self.expected_tokens(r) for r in running)
        return {True: expected / verify_seconds, False: len(running) / plain_seconds}

    def _verify_seconds(self, key: tuple[int, bool], bucket: BucketCosts) -> float:
        """A verify step's measured cost in this bucket; unmeasured, its lower bound: the plain cost times the largest
        verify / plain ratio measured at a smaller bucket of the same kind, or for a batch with a sampled request at a
        greedy bucket no larger (the ratio grows with the batch, as verify turns compute-bound sooner, and a sampled
        verify step costs at least a greedy one: it runs one a replay; 1 where none is measured). A verify that cannot
        win even so is not tried until an exploration."""
        verify, plain = bucket.seconds[True], bucket.seconds[False]
        if verify.count:
            return verify.value
        size, sampling = key
        ratios = [
            other.seconds[True].value / other.seconds[False].value
            for (other_size, other_sampling), other in self.costs.items()
            if (other_size < size if other_sampling == sampling else sampling and other_size <= size)
            and min(other.seconds[True].count, other.seconds[False].count) >= MIN_SAMPLES
        ]
        return plain.value * max(ratios, default=1.0)

    @staticmethod
    def _key(running: Sequence[Request]) -> tuple[int, bool]:
        return bucket_of(len(running)), any(not r.params.greedy for r in running)

    def _bucket(self, key: tuple[int, bool]) -> BucketCosts:
        found = self.costs.get(key)
        if found is None:
            found = self.costs[key] = BucketCosts()
        return found

    # ---- what a pass measured ----------------------------------------------------------------------------------
    def observe(self, running: Sequence[Request], verified: bool, seconds: float, steps: int) -> None:
        """A pass that only decoded ran `steps` device steps with one option in `seconds` (running: the batch it
        decided for, before anything finished)."""
        key = self._key(running)
        bucket = self._bucket(key)
        if verified == self.last:
            bucket.seconds[verified].add(seconds / max(1, steps))
        self.last = verified
        if bucket.exploring is not None:
            bucket.burst_left -= 1
            if bucket.burst_left <= 0:
                self._end_burst(running, key, bucket)
            return
        bucket.since += 1
        if bucket.since >= bucket.interval and bucket.seconds[False].count >= MIN_SAMPLES:
            bucket.exploring = not verified
            bucket.burst_left = BURST

    def _end_burst(self, running: Sequence[Request], key: tuple[int, bool], bucket: BucketCosts) -> None:
        explored, bucket.exploring, bucket.since = bucket.exploring, None, 0
        rates = self._rates(running, self._verify_seconds(key, bucket), bucket.seconds[False].value)
        if (rates[True] > rates[False]) == explored:
            bucket.interval = REEXPLORE_FROM
            return
        # a burst of the loser costs BURST * (best / explored - 1) passes of the best
        loss = BURST * (rates[not explored] / rates[explored] - 1)
        bucket.interval = min(max(2 * bucket.interval, round(loss / EXPLORATION_SHARE)), REEXPLORE_MAX)

    def accepted(self, req: Request, committed: list[int]) -> None:
        """A request's verify steps committed these many tokens each."""
        own = self.per_request.get(req.rid)
        if own is None:
            own = self.per_request[req.rid] = RunningMean()
        for n in committed:
            own.add(n)
            self.accept.add(n)

    def forget(self, req: Request) -> None:
        self.per_request.pop(req.rid, None)

    def reset_costs(self) -> None:
        """After a re-attach: memd's pools and the graphs are new, so the costs are measured again."""
        self.costs.clear()
        self.last = None
