"""The prefix cache end to end, with a bounded draft KV pool: a port of SGLang's
test_dflash_draft_kv_ratio.py (reference/000_3fcae185083e70ab.txt) to memd + modeld.

memd and modeld run as separate processes on the CPU in fp32: the default target (SmolLM2-135M-Instruct)
and the shipped DFLASH draft (modeld/default_draft: 4 sliding-window layers, window 256, block 16), memd
with --strict, --draft-kv-ratio 0.25 and --draft-window 256, at page size 1 and 64. Below ratio 1 the
draft's KV holds a quarter of the target's tokens; out-of-window draft slots are freed as requests
advance, and a cached prefix stays reusable while the draft KV of its trailing window survives.

Sizing: --max-total-tokens makes the draft pool (0.25 x target, page floored) the request cap plus two
windows, so that the draft side overflows with a handful of cached prompts while the target side still
holds all of them.
Every test ends with memd idle (nothing held but by the prefix cache) and, after FlushCache, both
pools fully free.
"""

import contextlib
import json
import math
import pathlib
import re
import sys

import pytest

import client
from memd.defaults import default_decode_lookahead, default_draft_dir
from tests.daemons import is_idle, run_memd, run_modeld, start_daemon, stop_daemon, wait_ready

WINDOW = 256
RATIO = 0.25
MAX_RUNNING = 2
CHUNK = 128  # memd's --chunked-prefill-size, and so modeld's (it reads memd's layout)
EVICTION_INTERVAL = 8  # memd's default --draft-eviction-interval
DECODE_LOOKAHEAD = default_decode_lookahead(draft=True)  # memd's default --decode-lookahead with a draft pool
LONG_NEW = 128  # new tokens of the long greedy generation (about 30 s a run on 2 CPU cores)

# Several draft windows long (> 3 x 256 tokens), so a repeated request is a prefix hit whose draft
# window lies well inside cached territory.
_LONG_PROMPT = " ".join(
    f"Entry {i}: the quick brown fox number {i} jumps over the lazy dog number {i + 1}." for i in range(35)
)
_ESSAY_QUESTION = (
    "\n\nWrite a detailed essay on how foxes and dogs are portrayed in folklore, "
    "with examples from at least three cultures."
)
_SIZING = re.compile(
    r"draft KV pool: window=(\d+), ratio=([0-9.]+), tokens=(\d+) \(request cap (\d+), (\d+) cached prefixes"
)


def draft_block() -> int:
    config = json.loads((default_draft_dir() / "config.json").read_text())
    return config["dflash_config"]["block_size"]


def page_ceil(n: int, page: int) -> int:
    return -(-n // page) * page


def expected_request_cap(page: int) -> int:
    """docs/architecture.md: (window + interval x block + page + page_ceil(block) + decode lookahead)
    x max_running + chunked_prefill + page."""
    block = draft_block()
    per_request = WINDOW + EVICTION_INTERVAL * block + page + page_ceil(block, page) + DECODE_LOOKAHEAD
    return per_request * MAX_RUNNING + CHUNK + page


def max_total_tokens(page: int) -> int:
    """The target pool whose draft share (RATIO x target, page floored) is the request cap plus
    two windows (page aligned)."""
    draft = page_ceil(expected_request_cap(page) + 2 * WINDOW, page)
    return int(draft / RATIO)


def variant(i: int) -> str:
    """Prompt i of the eviction test: they differ early (in the first entry), so they share only a
    few tokens (page 1) or nothing (page 64), and all have about the same length."""
    return _LONG_PROMPT.replace("quick", f"quick-{i}", 1) + _ESSAY_QUESTION


def memd_flags(page: int) -> list[str]:
    return [
        "--page-size",
        str(page),
        "--max-running-requests",
        str(MAX_RUNNING),
        "--max-total-tokens",
        str(max_total_tokens(page)),
        "--chunked-prefill-size",
        str(CHUNK),
        "--draft-model",
        str(default_draft_dir()),
        "--draft-kv-ratio",
        str(RATIO),
        "--draft-window",
        str(WINDOW),
        "--kv-cache-dtype",
        "float32",
        "--strict",
    ]


@pytest.fixture(scope="module", params=[1, 64], ids=["page1", "page64"])
def daemons(request, default_model):
    """memd (bounded draft pool) and a DFLASH modeld that verifies at every step (its speculation policy off: these
    tests read and write the draft's window through verify steps), per page size; run_memd checks at the end that
    nothing is held but by the prefix cache and that FlushCache frees both pools."""
    page = request.param
    dflash = ["--target-model", str(default_model), "--draft-model", str(default_draft_dir())]
    with (
        run_memd(default_model, *memd_flags(page)) as memd,
        run_modeld(memd, *dflash, tuning="adaptive_speculation=false") as modeld,
    ):
        with client.Client(modeld.address, timeout=600) as c:
            yield memd, modeld, c, page


@pytest.fixture(autouse=True)
def idle_then_free_after(daemons):
    yield
    daemons[0].assert_idle_then_flush(timeout=10)


def flush(memd):
    """FlushCache once every release has reached memd: the test starts with empty pools."""
    cap = memd.flush_and_wait_free(timeout=10)
    assert cap.target.free == cap.target.total and cap.draft.free == cap.draft.total, cap


def idle_capacity(memd):
    """Capacity once modeld's releases have reached memd (they ride on a later call)."""
    cap = memd.wait_idle(timeout=10)
    assert is_idle(cap), cap
    return cap


def generate(c, prompt: str, max_new_tokens: int):
    return c.generate(prompt, max_new_tokens=max_new_tokens, temperature=0, ignore_eos=True)


@contextlib.contextmanager
def second_modeld(memd, *args: str, ready_timeout: float = 180):
    """Another modeld on the same memd, beside the module's (run_modeld's socket name is taken)."""
    folder = pathlib.Path(memd.address[len("unix://") :]).parent
    address, log_path = f"unix://{folder / 'modeld-plain.sock'}", folder / "modeld-plain.log"
    proc = start_daemon(
        [sys.executable, "-m", "modeld", "--device", "cpu", "--memd", memd.address, "--listen", address, *args],
        log_path,
    )
    try:
        wait_ready(proc, log_path, "modeld ready", ready_timeout)
        yield address
    finally:
        stop_daemon(proc, timeout=30)


def pool_sizing(memd) -> tuple[int, float, int, int, int]:
    """(window, ratio, draft tokens, request cap, cached prefixes) from memd's start-up log."""
    sizing = _SIZING.search(memd.log())
    assert sizing is not None, "draft KV pool sizing not logged"
    window, ratio, tokens, cap, cached = sizing.groups()
    return int(window), float(ratio), int(tokens), int(cap), int(cached)


def test_draft_pool_is_ratio_of_target(daemons):
    memd, _, _, page = daemons
    window, ratio, draft_tokens, cap, cached = pool_sizing(memd)
    target_tokens = int(re.search(r"target KV pool: tokens=(\d+)", memd.log()).group(1))
    print(
        f"\n[page {page}] target tokens={target_tokens}, draft tokens={draft_tokens}, request cap={cap}, "
        f"cached prefixes at max concurrency={cached}"
    )
    assert window == WINDOW
    assert ratio == RATIO
    assert target_tokens == max_total_tokens(page)
    assert draft_tokens == math.floor(target_tokens * RATIO) // page * page
    assert draft_tokens >= cap
    assert cap == expected_request_cap(page)
    assert cached == (draft_tokens - cap) // (window + page)
    # Capacity agrees with the log.
    c = memd.capacity()
    assert c.has_draft
    assert (c.target.total, c.draft.total, c.request_cap) == (target_tokens, draft_tokens, cap)
    assert (c.draft_window, c.draft_kv_ratio, c.page_size, c.max_running_requests) == (WINDOW, RATIO, page, MAX_RUNNING)


def test_prefix_hit_reuses_whole_prompt(daemons):
    """A cached prefix keeps its trailing window, so nothing is held back: all whole pages of the
    prompt but the last token (always computed: its logits give the first new token)."""
    memd, _, c, page = daemons
    flush(memd)
    cold = generate(c, _LONG_PROMPT, 8)
    prompt_tokens = cold.prompt_tokens
    assert prompt_tokens > 3 * WINDOW
    assert cold.cached_tokens == 0
    warm = generate(c, _LONG_PROMPT, 8)
    print(f"\n[page {page}] prefix hit: prompt_tokens={prompt_tokens}, cached_tokens={warm.cached_tokens}")
    assert warm.prompt_tokens == prompt_tokens
    assert warm.cached_tokens > prompt_tokens - WINDOW
    assert warm.cached_tokens >= prompt_tokens - page
    assert warm.cached_tokens == (prompt_tokens - 1) // page * page
    assert warm.output_ids == cold.output_ids


@pytest.fixture(scope="module")
def long_runs(daemons):
    """Per page size, once: after FlushCache, the long prompt with LONG_NEW new tokens (cold), then
    again (warm). modeld checkpoints the prompt into memd's cache once it is prefilled, so the
    cold run's own out-of-window trims leave the prompt's trailing draft window to the cache."""
    memd, _, c, _ = daemons
    flush(memd)
    prompt = _LONG_PROMPT + _ESSAY_QUESTION
    return generate(c, prompt, LONG_NEW), generate(c, prompt, LONG_NEW)


def test_greedy_determinism_across_hit(daemons, long_runs):
    _, modeld, c, page = daemons
    cold, warm = long_runs
    prompt_tokens = cold.prompt_tokens
    print(
        f"\n[page {page}] {LONG_NEW} new tokens: prompt_tokens={prompt_tokens}, cold cached={cold.cached_tokens}, "
        f"warm cached={warm.cached_tokens}, accept length {warm.spec_accept_length:.2f}"
    )
    assert prompt_tokens > 3 * WINDOW and cold.cached_tokens == 0 and len(cold.output_ids) == LONG_NEW
    # Upstream asserts a hit (> 0); the whole prompt but its last page is reused here.
    assert warm.cached_tokens >= prompt_tokens - page > prompt_tokens - WINDOW
    assert warm.output_ids == cold.output_ids and warm.text == cold.text
    assert modeld.poll() is None and c.health() == "SERVING"


def test_evicted_window_falls_back(daemons):
    """More cached prefixes than the draft pool holds: the oldest loses its window (its draft KV is
    evicted, its target KV stays cached), and a hit on it re-prefills instead of reading freed slots."""
    memd, modeld, c, page = daemons
    flush(memd)
    window, _, draft_tokens, cap, _ = pool_sizing(memd)
    # Upstream: one more than the pool holds at the window each cached prefix keeps, with the cap
    # reserved for running requests. memd reserves nothing: one request at a time holds only its own
    # draft KV (about a window and a prefill chunk), and the rest of the cap holds cached windows too.
    # What does hold: every cached prefix keeps at least `window` tokens of live draft KV (the trim
    # frontier is page_floor(length - window), window being a multiple of the page), and so does the
    # running request. So num_prompts * window > draft_tokens forces a draft eviction before the last
    # prompt finishes, and the draft side evicts least recently used nodes first: prompt 0's.
    upstream = (draft_tokens - cap) // window + 2
    num_prompts = max(upstream, draft_tokens // window + 1)
    prompts = [variant(i) for i in range(num_prompts)]
    cold = generate(c, prompts[0], 64)
    prompt_tokens = cold.prompt_tokens
    assert prompt_tokens > 3 * WINDOW and cold.cached_tokens == 0
    others = [generate(c, prompt, 8) for prompt in prompts[1:]]
    assert all(r.cached_tokens < page + 8 for r in others), [r.cached_tokens for r in others]  # share little
    before = idle_capacity(memd)
    # The target side still caches every prompt (prompt 0's pages included); the fallback is the draft's.
    assert before.target.free + before.target.evictable == before.target.total
    assert before.target.evictable >= prompt_tokens - page
    assert before.target.evictable >= sum(r.prompt_tokens - page for r in [cold, *others])
    warm = generate(c, prompts[0], 64)
    print(
        f"\n[page {page}] after {num_prompts} prefixes (upstream formula {upstream}; draft tokens={draft_tokens}, "
        f"request cap={cap}): prompt_tokens={prompt_tokens}, cached_tokens={warm.cached_tokens}; "
        f"before the repeat target evictable={before.target.evictable}/{before.target.total}, "
        f"draft evictable={before.draft.evictable}/{before.draft.total}"
    )
    assert warm.cached_tokens <= prompt_tokens - WINDOW
    assert warm.output_ids == cold.output_ids and warm.text == cold.text
    assert modeld.poll() is None and c.health() == "SERVING"


def test_plain_modeld_hits_without_draft_kv(daemons, default_model):
    """A modeld without speculation writes no draft KV, so what it caches holds none, and its own
    hits need none: on the bounded pool a repeated prompt is a full hit with equal output. The DFLASH
    modeld then finds no usable window in that prefix (it never reads draft KV nobody wrote) and
    re-prefills, with the same greedy output."""
    memd, _, dflash, page = daemons
    flush(memd)
    with second_modeld(memd, "--target-model", str(default_model), "--speculative-algorithm", "none") as address:
        with client.Client(address, timeout=600) as c:
            cold = generate(c, _LONG_PROMPT, 8)
            cached = idle_capacity(memd)
            warm = generate(c, _LONG_PROMPT, 8)
    spec = generate(dflash, _LONG_PROMPT, 8)
    print(
        f"\n[page {page}] plain modeld: prompt_tokens={cold.prompt_tokens}, cached_tokens={warm.cached_tokens}; "
        f"after the first: target evictable={cached.target.evictable}, draft evictable={cached.draft.evictable}; "
        f"then DFLASH cached_tokens={spec.cached_tokens}"
    )
    assert cold.cached_tokens == 0 and cold.spec_verify_ct == 0
    assert cached.draft.evictable == 0 and cached.target.evictable >= cold.prompt_tokens - page
    assert warm.cached_tokens >= warm.prompt_tokens - page
    assert warm.output_ids == cold.output_ids
    assert spec.cached_tokens <= spec.prompt_tokens - WINDOW and spec.spec_verify_ct > 0
    assert spec.output_ids == cold.output_ids


def test_default_set_up_reuses_a_repeated_prompt(default_model):
    """memd and modeld with no draft flags (the demo's set-up): no draft pool is made, and the second call of a
    prompt is served from the prefix cache."""
    with run_memd(default_model, "--max-total-tokens", "4096", "--strict") as memd:
        assert not memd.capacity().has_draft
        with run_modeld(memd, "--target-model", str(default_model)) as modeld, client.Client(modeld.address) as c:
            first = c.generate("What is the capital of France?", chat=True, max_new_tokens=8, temperature=0)
            again = c.generate("What is the capital of France?", chat=True, max_new_tokens=8, temperature=0)
            assert first.cached_tokens == 0 and again.cached_tokens > 0
            assert again.output_ids == first.output_ids
