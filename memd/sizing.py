"""Pool sizing, after SGLang's DFlashDraftSWAPoolConfigurator (--speculative-draft-kv-ratio).

Budget B bytes, target bytes/token c_t, draft bytes/token c_d, ratio r:
    target_tokens = page_floor(B' / (c_t + ceil(r * c_d)))    B' = B less the two sink pages
    draft_tokens  = page_floor(floor(r * target_tokens))
At r = 1 the draft holds one slot per target token (the plain configuration) and
no cap applies. The ratio is kept as an exact decimal so that r * T never rounds up.
"""

import math
from dataclasses import dataclass
from fractions import Fraction

MIN_RATIO_STEP = Fraction(1, 1000)


class SizingError(ValueError):
    """The budget cannot hold the pools; `min_ratio` is set when a larger ratio would."""

    def __init__(self, message: str, min_ratio: float | None = None):
        super().__init__(message)
        self.min_ratio = min_ratio


@dataclass(frozen=True)
class DraftShape:
    """What sizing needs of the draft: its KV bytes/token and the window rules."""

    bytes_per_token: int
    block_size: int
    window: int | None  # required below ratio 1
    eviction_interval: int  # scheduler steps between out-of-window frees
    lookahead: int = 0  # decode positions a request may hold ahead of need


@dataclass(frozen=True)
class PoolSizes:
    target_tokens: int
    draft_tokens: int  # 0 without a draft
    target_bytes_per_token: int
    draft_bytes_per_token: int
    ratio: Fraction
    page_size: int
    request_cap: int  # 0 unless ratio < 1
    cached_prefixes: int  # windows the pool keeps beyond the cap, at max concurrency

    def kv_bytes(self) -> tuple[int, int]:
        """Bytes of the target and draft KV buffers, the sink page included."""
        target = (self.target_tokens + self.page_size) * self.target_bytes_per_token
        draft = (self.draft_tokens + self.page_size) * self.draft_bytes_per_token if self.draft_tokens else 0
        return target, draft

    def log_line(self, window: int) -> str:
        return (
            f"draft KV pool: window={window}, ratio={float(self.ratio)}, tokens={self.draft_tokens} "
            f"(request cap {self.request_cap}, {self.cached_prefixes} cached prefixes at max concurrency)"
        )


def page_floor(n: int, page: int) -> int:
    return n // page * page


def page_ceil(n: int, page: int) -> int:
    return -(-n // page) * page


def exact_ratio(ratio: float) -> Fraction:
    return Fraction(repr(float(ratio)))


def validate_ratio(ratio: float) -> None:
    if not 0 < ratio <= 1:
        raise SizingError(
            f"--draft-kv-ratio must be in (0, 1], got {ratio}. Above 1 the draft would hold "
            "slots the target cannot address: every draft slot is reached through a target slot."
        )


def request_cap(draft: DraftShape, page: int, max_running: int, chunked_prefill: int) -> int:
    """Most draft slots the running requests hold at once: per request the window, the
    blocks in flight over the eviction interval, a page of slack, the block being verified
    and the decode lookahead; times the requests; plus one prefill chunk and its partial page."""
    per_request = (
        draft.window
        + draft.eviction_interval * draft.block_size
        + page
        + page_ceil(draft.block_size, page)
        + draft.lookahead
    )
    return per_request * max_running + chunked_prefill + page


def _cell(target_cost: int, draft: DraftShape | None, ratio: Fraction) -> int:
    if draft is None:
        return target_cost
    if ratio == 1:
        return target_cost + draft.bytes_per_token
    return target_cost + max(1, math.ceil(ratio * draft.bytes_per_token))


def _finish(target_tokens, target_cost, draft, ratio, page, cap) -> PoolSizes:
    if target_tokens <= 0:
        raise SizingError("the KV budget does not hold a single page of the target pool")
    if draft is None:
        draft_tokens, cached = 0, 0
    elif ratio == 1:
        draft_tokens, cached = target_tokens, 0
    else:
        draft_tokens = page_floor(math.floor(ratio * target_tokens), page)
        cached = max(0, draft_tokens - cap) // (draft.window + page)
    return PoolSizes(
        target_tokens=target_tokens,
        draft_tokens=draft_tokens,
        target_bytes_per_token=target_cost,
        draft_bytes_per_token=draft.bytes_per_token if draft else 0,
        ratio=ratio if draft else Fraction(1),
        page_size=page,
        request_cap=cap if draft is not None and ratio < 1 else 0,
        cached_prefixes=cached,
    )


def size_from_budget(
    budget: int, target_cost: int, draft: DraftShape | None, ratio: float, page: int, cap: int
) -> PoolSizes:
    """Pools that fit `budget` bytes of KV (sink pages included)."""
    return _checked(lambda r: _size_budget(budget, target_cost, draft, r, page, cap), draft, ratio, cap)


def size_from_tokens(
    max_tokens: int, target_cost: int, draft: DraftShape | None, ratio: float, page: int, cap: int
) -> PoolSizes:
    """A token cap fixes the target pool; the ratio alone sets the draft's."""
    return _checked(
        lambda r: _finish(page_floor(max_tokens, page), target_cost, draft, r, page, cap), draft, ratio, cap
    )


def _size_budget(budget, target_cost, draft, ratio, page, cap) -> PoolSizes:
    sinks = page * (target_cost + (draft.bytes_per_token if draft else 0))
    tokens = page_floor(max(0, budget - sinks) // _cell(target_cost, draft, ratio), page)
    return _finish(tokens, target_cost, draft, ratio, page, cap)


def _checked(size, draft: DraftShape | None, ratio: float, cap: int) -> PoolSizes:
    validate_ratio(ratio)
    exact = exact_ratio(ratio)
    sizes = size(exact)
    if draft is None or exact == 1 or sizes.draft_tokens >= cap:
        return sizes
    minimum = _smallest_working_ratio(size, exact, cap)
    raise SizingError(
        f"--draft-kv-ratio {ratio} gives the draft {sizes.draft_tokens} slots, below the {cap} its "
        f"running requests need. Use at least {float(minimum)}, or lower --max-running-requests, "
        "--draft-eviction-interval, --chunked-prefill-size or --decode-lookahead.",
        min_ratio=float(minimum),
    )


def _smallest_working_ratio(size, below: Fraction, cap: int) -> Fraction:
    """Smallest multiple of 0.001 above `below` whose sizing covers the cap; ratio 1 always
    does (it is the plain configuration, which needs no cap)."""
    candidate = (below // MIN_RATIO_STEP + 1) * MIN_RATIO_STEP
    while candidate < 1:
        sizes = size(candidate)
        if sizes.draft_tokens >= cap:
            return candidate
        # Jump close to the answer: draft tokens grow about linearly with the ratio.
        guess = Fraction(cap, max(1, sizes.target_tokens))
        candidate = max(candidate + MIN_RATIO_STEP, (guess // MIN_RATIO_STEP) * MIN_RATIO_STEP)
    size(Fraction(1))  # raises when the budget holds no pools at any ratio
    return Fraction(1)
