"""memd.sizing, re-expressing SGLang's TestDFlashDraftKVRatioConfigurator and
test_draft_kv_ratio_range (--speculative-draft-kv-ratio) against memd's pure sizing."""

import math
import re
from fractions import Fraction

import pytest

from memd.sizing import DraftShape, PoolSizes, SizingError, request_cap, size_from_budget, size_from_tokens

# Target: 4 layers, 2 KV heads, head dim 64, bf16 -> K and V rows of every layer.
TARGET_COST = 2 * 4 * 2 * 64 * 2  # 2048 bytes/token
DRAFT_COST = 48  # bytes/token of the draft KV
WINDOW = 64
BLOCK = 8
INTERVAL = 8
MAX_RUNNING = 2
CHUNKED_PREFILL = 32
BUDGET = 10_000_000

DRAFT = DraftShape(bytes_per_token=DRAFT_COST, block_size=BLOCK, window=WINDOW, eviction_interval=INTERVAL)

LOG_LINE = re.compile(
    r"^draft KV pool: window=(\d+), ratio=([0-9.]+), tokens=(\d+) "
    r"\(request cap (\d+), (\d+) cached prefixes at max concurrency\)$"
)


def _page_floor(n: int, page: int) -> int:
    return n // page * page


def _page_ceil(n: int, page: int) -> int:
    return -(-n // page) * page


def _cap(page: int) -> int:
    return request_cap(DRAFT, page, MAX_RUNNING, CHUNKED_PREFILL)


def _sinks(page: int, draft: DraftShape | None = DRAFT) -> int:
    """Bytes of the sink page of each pool, which the budget pays for first."""
    return page * (TARGET_COST + (draft.bytes_per_token if draft else 0))


def _budget(ratio: float, budget: int = BUDGET, page: int = 1) -> PoolSizes:
    return size_from_budget(budget, TARGET_COST, DRAFT, ratio, page, _cap(page))


def _tokens(ratio: float, tokens: int = 1000, page: int = 1) -> PoolSizes:
    return size_from_tokens(tokens, TARGET_COST, DRAFT, ratio, page, _cap(page))


# --- the ratio is priced into the bytes per token ------------------------------------


def test_ratio_is_priced_into_cell_size():
    sizes = _budget(0.5)
    # Half a draft slot per target token costs half the draft's bytes/token.
    expected = _page_floor((BUDGET - _sinks(1)) // (TARGET_COST + DRAFT_COST // 2), 1)
    assert sizes.target_tokens == expected
    assert sizes.target_bytes_per_token == TARGET_COST
    assert sizes.draft_bytes_per_token == DRAFT_COST
    assert sizes.ratio == Fraction(1, 2)


@pytest.mark.parametrize("page", [1, 16, 64])
@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.9, 1.0])
def test_target_tokens_follow_the_priced_cell(ratio, page):
    sizes = _budget(ratio, page=page)
    cell = TARGET_COST + math.ceil(Fraction(repr(ratio)) * DRAFT_COST)
    assert sizes.target_tokens == _page_floor((BUDGET - _sinks(page)) // cell, page)


def test_draft_share_below_one_byte_is_priced_at_one():
    # 0.001 * 48 bytes is 0.048 of a byte: the pool still prices a whole byte per token.
    sizes = size_from_budget(BUDGET, TARGET_COST, DRAFT, 0.001, 1, cap=0)
    assert sizes.target_tokens == (BUDGET - _sinks(1)) // (TARGET_COST + 1)
    assert sizes.draft_tokens == math.floor(Fraction("0.001") * sizes.target_tokens)


@pytest.mark.parametrize("page", [1, 16, 64])
@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("budget", [20_000_000, 123_456_789, 1_000_000_007])
def test_memory_utilization(budget, ratio, page):
    sizes = _budget(ratio, budget=budget, page=page)
    target_bytes, draft_bytes = sizes.kv_bytes()
    # kv_bytes counts each pool's sink page on top of its tokens.
    assert target_bytes == (sizes.target_tokens + page) * TARGET_COST
    assert draft_bytes == (sizes.draft_tokens + page) * DRAFT_COST
    used = target_bytes + draft_bytes
    assert used <= budget
    assert used > budget * 0.99


@pytest.mark.parametrize("page", [1, 16, 64])
@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.9, 0.333, 0.1])
def test_draft_pool_is_ratio_of_target(ratio, page):
    sizes = _budget(ratio, budget=50_000_000, page=page)
    exact = Fraction(repr(ratio))
    assert sizes.draft_tokens == _page_floor(math.floor(exact * sizes.target_tokens), page)
    assert sizes.draft_tokens <= exact * sizes.target_tokens


@pytest.mark.parametrize("page", [16, 64])
@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.9, 1.0])
def test_page_alignment(ratio, page):
    sizes = _budget(ratio, budget=50_000_000, page=page)
    assert sizes.target_tokens > 0 and sizes.draft_tokens > 0
    assert sizes.target_tokens % page == 0
    assert sizes.draft_tokens % page == 0
    assert sizes.page_size == page


@pytest.mark.parametrize("page", [16, 64])
def test_page_alignment_with_a_token_cap(page):
    sizes = _tokens(0.7, tokens=5000, page=page)
    assert sizes.target_tokens == _page_floor(5000, page)
    assert sizes.draft_tokens % page == 0
    assert sizes.draft_tokens == _page_floor(math.floor(Fraction("0.7") * sizes.target_tokens), page)


def test_constraint_keeps_ratio():
    sizes = size_from_tokens(1000, TARGET_COST, DRAFT, 0.5, 1, _cap(1))
    assert sizes.target_tokens == 1000
    assert sizes.draft_tokens == 500


# --- below the request cap -------------------------------------------------------------


def _check_usable_minimum(size, ratio: float, page: int):
    """`size(ratio)` must fail naming a minimum that itself passes and is the smallest
    passing ratio on the 0.001 grid."""
    cap = _cap(page)
    with pytest.raises(SizingError) as raised:
        size(ratio)
    message = str(raised.value)
    assert re.search(r"below the \d+ its running requests need", message)
    assert int(re.search(r"below the (\d+) its running requests need", message).group(1)) == cap
    minimum = float(re.search(r"Use at least ([0-9.]+)", message).group(1))
    assert raised.value.min_ratio == minimum
    assert ratio < minimum <= 1

    sizes = size(minimum)
    assert sizes.draft_tokens >= cap
    assert sizes.request_cap == cap
    assert sizes.draft_tokens == _page_floor(math.floor(Fraction(repr(minimum)) * sizes.target_tokens), page)

    # The named minimum is the smallest on the 0.001 grid: one step less still fails.
    just_below = float(Fraction(repr(minimum)) - Fraction(1, 1000))
    if just_below > 0:
        with pytest.raises(SizingError, match=r"below the \d+ its running requests need"):
            size(just_below)


@pytest.mark.parametrize("page", [1, 16, 64])
@pytest.mark.parametrize("ratio", [0.001, 0.01, 0.05])
def test_budget_ratio_below_request_cap_raises_a_usable_minimum(ratio, page):
    """0.001 also prices the draft's share below one byte (0.048 of 48)."""
    _check_usable_minimum(lambda r: _budget(r, page=page), ratio, page)


@pytest.mark.parametrize("page", [1, 16, 64])
@pytest.mark.parametrize("ratio", [0.001, 0.01, 0.2])
def test_token_cap_ratio_below_request_cap_raises_a_usable_minimum(ratio, page):
    _check_usable_minimum(lambda r: _tokens(r, tokens=1000, page=page), ratio, page)


def test_token_cap_minimum_is_exact():
    # The target is fixed at 1000 tokens, so covering 307 slots needs exactly 0.307.
    assert _cap(1) == 307
    with pytest.raises(SizingError) as raised:
        _tokens(0.001)
    assert raised.value.min_ratio == 0.307
    assert "gives the draft 1 slots" in str(raised.value)


def test_minimum_is_one_when_no_smaller_ratio_covers_the_cap():
    # 100 target tokens can never hold 307 draft slots below ratio 1; ratio 1 needs no cap.
    with pytest.raises(SizingError) as raised:
        _tokens(0.5, tokens=100)
    assert raised.value.min_ratio == 1.0
    assert "Use at least 1.0" in str(raised.value)
    assert _tokens(1.0, tokens=100).draft_tokens == 100


# --- ratio 1 and no draft ----------------------------------------------------------------


@pytest.mark.parametrize("page", [1, 16, 64])
def test_ratio_of_one_leaves_the_pool_config_alone(page):
    sizes = _budget(1.0, page=page)
    assert sizes.draft_tokens == sizes.target_tokens
    assert sizes.request_cap == 0
    assert sizes.cached_prefixes == 0
    assert sizes.ratio == 1
    assert sizes.target_tokens == _page_floor((BUDGET - _sinks(page)) // (TARGET_COST + DRAFT_COST), page)


@pytest.mark.parametrize("mode", ["budget", "tokens"])
def test_ratio_of_one_has_no_cap_check(mode):
    huge = 10**15
    if mode == "budget":
        sizes = size_from_budget(BUDGET, TARGET_COST, DRAFT, 1.0, 1, huge)
    else:
        sizes = size_from_tokens(1000, TARGET_COST, DRAFT, 1.0, 1, huge)
    assert sizes.draft_tokens == sizes.target_tokens
    assert sizes.request_cap == 0


@pytest.mark.parametrize("page", [1, 16, 64])
def test_no_draft_gives_the_target_the_whole_budget(page):
    sizes = size_from_budget(BUDGET, TARGET_COST, None, 1.0, page, 0)
    assert sizes.target_tokens == _page_floor((BUDGET - _sinks(page, None)) // TARGET_COST, page)
    assert sizes.draft_tokens == 0
    assert sizes.draft_bytes_per_token == 0
    assert sizes.request_cap == 0
    target_bytes, draft_bytes = sizes.kv_bytes()
    assert draft_bytes == 0
    assert target_bytes <= BUDGET


def test_no_draft_with_a_token_cap():
    sizes = size_from_tokens(1000, TARGET_COST, None, 1.0, 16, 0)
    assert sizes.target_tokens == 992
    assert sizes.draft_tokens == 0


def test_budget_without_a_single_page_raises():
    with pytest.raises(SizingError, match="does not hold a single page"):
        size_from_budget(_sinks(64) + 10, TARGET_COST, DRAFT, 1.0, 64, 0)


# --- ratio range -------------------------------------------------------------------------


@pytest.mark.parametrize("ratio", [0, -0.5, 1.5])
@pytest.mark.parametrize("mode", ["budget", "tokens"])
def test_draft_kv_ratio_range(ratio, mode):
    with pytest.raises(SizingError, match=r"must be in \(0, 1\]") as raised:
        if mode == "budget":
            _budget(ratio)
        else:
            _tokens(ratio)
    message = str(raised.value)
    # Why above 1 is meaningless: the target cannot address the extra draft slots.
    assert "Above 1" in message
    assert "cannot address" in message
    assert raised.value.min_ratio is None


# --- log line ----------------------------------------------------------------------------


@pytest.mark.parametrize("page", [1, 16, 64])
@pytest.mark.parametrize("ratio", [0.25, 0.5])
def test_log_line(ratio, page):
    sizes = _budget(ratio, budget=50_000_000, page=page)
    line = sizes.log_line(WINDOW)
    match = LOG_LINE.match(line)
    assert match, line
    window, logged_ratio, tokens, cap, cached = match.groups()
    assert int(window) == WINDOW
    assert float(logged_ratio) == ratio
    assert int(tokens) == sizes.draft_tokens
    assert int(cap) == sizes.request_cap == _cap(page)
    assert int(cached) == sizes.cached_prefixes
    # Each cached prefix keeps its window (and a page) beyond what running requests hold.
    assert sizes.cached_prefixes == (sizes.draft_tokens - sizes.request_cap) // (WINDOW + page)
    assert sizes.cached_prefixes > 0


# --- request cap -------------------------------------------------------------------------


@pytest.mark.parametrize("page", [1, 16, 64])
@pytest.mark.parametrize("block", [1, 8, 17])
@pytest.mark.parametrize("interval", [0, 1, 8])
@pytest.mark.parametrize("max_running,chunked", [(1, 1), (2, 32), (16, 2048)])
@pytest.mark.parametrize("lookahead", [0, 32])
def test_request_cap_formula(page, block, interval, max_running, chunked, lookahead):
    draft = DraftShape(
        bytes_per_token=DRAFT_COST, block_size=block, window=WINDOW, eviction_interval=interval, lookahead=lookahead
    )
    expected = (WINDOW + interval * block + page + _page_ceil(block, page) + lookahead) * max_running + chunked + page
    assert request_cap(draft, page, max_running, chunked) == expected


def test_request_cap_worked_example():
    # (64 + 8*8 + 1 + 8) * 2 + 32 + 1 at page 1; (64 + 64 + 64 + 64) * 2 + 32 + 64 at page 64.
    assert _cap(1) == 307
    assert _cap(64) == 608
