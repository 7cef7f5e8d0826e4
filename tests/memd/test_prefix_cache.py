"""The prefix cache inside memd's SlotManager (memd.prefix_cache, wired in through match_prefix,
Release.inserts of finishing and of running requests (checkpoints), flush_cache, cache_counts and the
eviction in step), on CPU with numpy tables.

Every test drives a real SlotManager and runs the strict invariants (check_structure) after every
operation. The unit tests pin the semantics one at a time (match and insert, locks, target and draft
eviction, tombstones and their revival, out-of-window trims, flush, clients that write no draft KV,
checkpoints, the feasibility of a step whose release changes what the cache can give back);
the state machine at the end mixes all operations at random over prompts that share prefixes, with a
fake KV buffer per side (token * 100000 + position at every slot written) so that a match serving a
wrong, stale or aliased page shows up as wrong content.
"""

import itertools
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from memd.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from memd.invariants import check_structure
from memd.slots import DraftMode, Release, SlotManager

BOUNDED, IDENTITY, NONE = DraftMode.BOUNDED, DraftMode.IDENTITY, DraftMode.NONE
W = 8  # the bounded draft window of every test (2 pages at P = 4)
MODEL = "model-m"  # the model identity of every session here (tests/memd/test_prefix_cache_models.py mixes them)
ALL_MODES = [BOUNDED, IDENTITY, NONE]


# ---- construction and small helpers ----------------------------------------------------------------


def make(
    P, mode=BOUNDED, *, target=64, draft=64, window=W, trim_gap=0, max_requests=6, ctx=64, sessions=(("s", True),)
):
    """A SlotManager with pools of `target` / `draft` tokens and the given sessions open."""
    assert target % P == 0 and draft % P == 0 and ctx % P == 0
    mgr = SlotManager(
        target_pages=target // P,
        draft_pages=draft // P if mode is BOUNDED else 0,
        page_size=P,
        mode=mode,
        window=window,
        trim_gap=trim_gap,
        max_requests=max_requests,
        context_len=ctx,
        mapping=None if mode is NONE else np.zeros((target // P + 1) * P, np.int32),
        req_to_token=np.zeros((max_requests + 1, ctx), np.int32),
    )
    for name, writes_draft in sessions:
        mgr.open_session(name, model=MODEL, writes_draft=writes_draft)
    check_structure(mgr)
    return mgr


def seq(tag: int, n: int) -> list[int]:
    """n distinct tokens; different tags never share a first token."""
    return [tag * 1000 + i + 1 for i in range(n)]


def floor(n: int, P: int) -> int:
    return n // P * P


def match(mgr, rid, tokens, session="s"):
    m = mgr.match_prefix(session, rid, list(tokens))
    check_structure(mgr)
    assert m.cached_len % mgr.P == 0 and m.cached_len <= len(tokens)
    assert len(m.target_slots) == len(m.draft_slots) == m.cached_len
    return m


def step(mgr, session="s", release=Release(), extends=(), grows=()):
    out = mgr.step(session, release, extends=list(extends), grows=list(grows))
    check_structure(mgr)
    return out


def run_prompt(mgr, rid, tokens, session="s"):
    """Match `tokens`, then prefill the rest: (cached length, target slots, draft slots) by position."""
    m = match(mgr, rid, tokens, session)
    t, d = list(m.target_slots), list(m.draft_slots)
    if len(tokens) > m.cached_len:
        [a] = step(mgr, session, extends=[(rid, m.cached_len, len(tokens) - m.cached_len)])
        assert a.start == m.cached_len
        t += list(a.target_slots)
        d += list(a.draft_slots)
    return m.cached_len, np.array(t, np.int64), np.array(d, np.int64)


def finish(mgr, rid, tokens=None, session="s"):
    inserts = ((rid, tuple(tokens)),) if tokens is not None else ()
    return step(mgr, session, Release(finishes=(rid,), inserts=inserts))


_probe_ids = itertools.count()


def probe(mgr, tokens, session="s") -> int:
    """The cached length a new request for `tokens` gets (it is then finished without insert)."""
    rid = f"probe{next(_probe_ids)}"
    m = match(mgr, rid, tokens, session)
    finish(mgr, rid, session=session)
    return m.cached_len


def free(mgr) -> tuple[int, int | None]:
    return mgr.target.free_tokens, (mgr.draft.free_tokens if mgr.draft is not None else None)


def snapshot(mgr) -> dict:
    snap = {
        "target_free": sorted(mgr.target._free),
        "counts": mgr.cache_counts(),
        "owned": tuple(sorted(x) for x in mgr.cache.owned()),
        "req_to_token": mgr.req_to_token.copy(),
        "held": mgr.held_tokens(),
        "rows": sorted(mgr.free_rows),
        "requests": {
            (r.session, r.rid): (
                r.length,
                r.draft_start,
                list(r.target_pages),
                list(r.draft_pages),
                r.cached_pages,
                r.locked,
            )
            for r in mgr.requests()
        },
        "locks": dict(mgr.cache.locks),
    }
    if mgr.mapping is not None:
        snap["mapping"] = mgr.mapping.copy()
    if mgr.draft is not None:
        snap["draft_free"] = sorted(mgr.draft._free)
    return snap


def assert_unchanged(before: dict, after: dict) -> None:
    assert before.keys() == after.keys()
    for key in before:
        a, b = before[key], after[key]
        same = np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b
        assert same, f"{key} changed"


def assert_all_free(mgr) -> None:
    check_structure(mgr)
    assert mgr.target.free_pages == mgr.target.num_pages
    if mgr.draft is not None:
        assert mgr.draft.free_pages == mgr.draft.num_pages
    assert mgr.cache_counts() == (0, 0, 0, 0)
    assert not mgr.req_to_token.any()
    if mgr.mapping is not None:
        assert not mgr.mapping.any()


def mapped(mgr, target_slots) -> np.ndarray:
    return mgr.translate(np.asarray(target_slots, np.int64)).astype(np.int64)


pages = pytest.mark.parametrize("P", [1, 4], ids=["P1", "P4"])
modes = pytest.mark.parametrize("mode", ALL_MODES, ids=lambda m: m.value)
draft_modes = pytest.mark.parametrize("mode", [BOUNDED, IDENTITY], ids=lambda m: m.value)


# ---- match and insert ------------------------------------------------------------------------------


@pages
@modes
def test_match_returns_the_finished_requests_pages(P, mode):
    mgr = make(P, mode)
    A = seq(1, 13)
    cached, t1, d1 = run_prompt(mgr, "r1", A)
    assert cached == 0, "a match on an empty cache"
    finish(mgr, "r1", A)
    L = floor(13, P)  # the partial last page is not cached
    assert mgr.cache_counts()[:2] == (L, 0)
    assert mgr.cache_counts()[2:] == ((L, 0) if mode is not NONE else (0, 0))

    m = match(mgr, "r2", A)
    assert m.cached_len == L
    assert np.array_equal(m.target_slots, t1[:L]), "the match must hand out the finished request's slots"
    if mode is BOUNDED:
        ws = floor(max(0, L - W), P)
        assert np.array_equal(m.draft_slots[ws:], d1[ws:L]) and not m.draft_slots[:ws].any()
    elif mode is IDENTITY:
        assert np.array_equal(m.draft_slots, m.target_slots)
    else:
        assert not m.draft_slots.any()
    assert mgr.cache_counts()[:2] == (0, L), "a running match protects its pages"
    if mode is BOUNDED:  # its window's draft pages alone: those before it stay evictable
        assert mgr.cache_counts()[2:] == (ws, L - ws)
    elif mode is IDENTITY:
        assert mgr.cache_counts()[2:] == (0, L)

    # capped by the query's whole pages; the longest shared prefix otherwise
    assert match(mgr, "r3", A[:6]).cached_len == floor(6, P)
    assert np.array_equal(mgr.sessions["s"]["r3"].target_pages, [s // P for s in t1[: floor(6, P) : P]])
    assert match(mgr, "r4", A[:7] + [999] * 6).cached_len == floor(7, P)
    assert match(mgr, "r5", A + [5, 6, 7]).cached_len == L
    assert match(mgr, "r6", [999] + A).cached_len == 0
    for rid in ("r2", "r3", "r4", "r5", "r6"):
        finish(mgr, rid)
    assert mgr.cache_counts()[:2] == (L, 0)
    assert mgr.flush_cache() == (L, L if mode is not NONE else 0)
    assert_all_free(mgr)


@pages
@modes
def test_a_second_insert_of_the_same_tokens_frees_its_duplicate_pages(P, mode):
    mgr = make(P, mode)
    A = seq(1, 16)
    _, t1, _ = run_prompt(mgr, "r1", A)
    _, t2, _ = run_prompt(mgr, "r2", A)  # both prefill: nothing cached yet
    finish(mgr, "r1", A)
    before = free(mgr)
    finish(mgr, "r2", A)
    after = free(mgr)
    assert after[0] == before[0] + 16
    if mode is BOUNDED:
        assert after[1] == before[1] + 16
    assert mgr.cache_counts()[:2] == (16, 0)
    assert np.array_equal(match(mgr, "r3", A).target_slots, t1)
    finish(mgr, "r3")
    mgr.flush_cache()
    assert_all_free(mgr)


# ---- locks ------------------------------------------------------------------------------------------


@pages
@modes
@pytest.mark.parametrize("same_step", [False, True], ids=["finish_first", "finish_in_the_same_step"])
def test_a_running_match_is_protected_from_eviction(P, mode, same_step):
    mgr = make(P, mode, target=32, draft=32)
    A = seq(1, 16)
    run_prompt(mgr, "r1", A)
    finish(mgr, "r1", A)
    assert match(mgr, "r2", A).cached_len == 16
    # a bounded pool protects the draft KV of the match's window alone (the last W tokens)
    assert mgr.cache_counts() == {BOUNDED: (0, 16, 16 - W, W), IDENTITY: (0, 16, 0, 16), NONE: (0, 16, 0, 0)}[mode]
    before = snapshot(mgr)
    with pytest.raises(ResourceExhausted):
        mgr.step("s", Release(), extends=[("r3", 0, 24)])  # 16 free, the other 16 are locked
    assert_unchanged(before, snapshot(mgr))
    check_structure(mgr)
    if same_step:  # the finish unlocks what the allocation of the same call evicts
        step(mgr, release=Release(finishes=("r2",)), extends=[("r3", 0, 24)])
    else:
        finish(mgr, "r2")
        assert mgr.cache_counts() == ((16, 0, 16, 0) if mode is not NONE else (16, 0, 0, 0))
        step(mgr, extends=[("r3", 0, 24)])
    # the allocation evicted the unlocked prefix as far as it needed: a bounded pool's lock had cut it at the
    # window's start, so the first 16 - W tokens outlive the eviction of the rest
    kept = 16 - W if mode is BOUNDED else 0
    assert mgr.cache_counts() == (kept, 0, kept if mode is not NONE else 0, 0)
    assert probe(mgr, A) == kept
    finish(mgr, "r3")
    mgr.flush_cache()
    assert_all_free(mgr)


@pages
@modes
def test_a_lock_protects_only_the_matched_path(P, mode):
    mgr = make(P, mode, target=32, draft=32)
    A = seq(1, 16)
    run_prompt(mgr, "r1", A)
    finish(mgr, "r1", A)
    assert match(mgr, "r2", A[:8]).cached_len == 8
    assert mgr.cache_counts()[:2] == (8, 8)
    before = snapshot(mgr)
    with pytest.raises(ResourceExhausted):
        mgr.step("s", Release(), extends=[("r3", 0, 25)])
    assert_unchanged(before, snapshot(mgr))
    step(mgr, extends=[("r3", 0, 24)])  # 16 free + the 8 unlocked ones
    assert mgr.cache_counts()[:2] == (0, 8)
    finish(mgr, "r2")
    assert probe(mgr, A) == 8
    finish(mgr, "r3")
    mgr.flush_cache()
    assert_all_free(mgr)


# ---- target eviction ---------------------------------------------------------------------------------


@pages
@modes
def test_target_eviction_takes_the_least_recently_used_first(P, mode):
    mgr = make(P, mode, target=32, draft=32)
    A, B, C = seq(1, 8), seq(2, 8), seq(3, 8)
    for rid, toks in (("a", A), ("b", B), ("c", C)):
        run_prompt(mgr, rid, toks)
        finish(mgr, rid, toks)
    assert probe(mgr, B) == 8  # B is used again: the order is now A, C, B
    assert mgr.cache_counts()[0] == 24
    step(mgr, extends=[("d", 0, 16)])  # 8 free: one prompt must go
    assert mgr.cache_counts()[0] == 16
    assert probe(mgr, A) == 0, "A was the least recently used"
    finish(mgr, "d")
    step(mgr, extends=[("e", 0, 24)])  # 16 free: one more
    assert probe(mgr, C) == 0, "C was used before B"
    assert probe(mgr, B) == 8
    finish(mgr, "e")
    mgr.flush_cache()
    assert_all_free(mgr)


@pages
@modes
def test_target_eviction_takes_leaves_and_keeps_their_shared_prefix(P, mode):
    mgr = make(P, mode, target=32, draft=32)
    X, Y, Z = seq(1, 8), seq(2, 8), seq(3, 8)
    run_prompt(mgr, "r1", X)
    finish(mgr, "r1", X)
    cached, txy, _ = run_prompt(mgr, "r2", X + Y)
    assert cached == 8
    finish(mgr, "r2", X + Y)  # X and Y now have the same last use; Y is the leaf
    run_prompt(mgr, "r3", Z)
    finish(mgr, "r3", Z)
    step(mgr, extends=[("big", 0, 16)])  # 8 free: evicts the leaf Y, not its parent X
    assert mgr.cache_counts()[0] == 16
    m = match(mgr, "r4", X + Y)
    assert m.cached_len == 8, "a later match of the evicted prompt falls back to the shared prefix"
    assert np.array_equal(m.target_slots, txy[:8])
    for rid in ("r4", "big"):
        finish(mgr, rid)
    assert probe(mgr, Z) == 8
    mgr.flush_cache()
    assert_all_free(mgr)


# ---- draft eviction, tombstones and their revival (bounded draft pool) ---------------------------------


@pages
def test_draft_eviction_tombstones_the_lru_node_and_an_insert_revives_it(P):
    mgr = make(P, BOUNDED, target=64, draft=24)  # target room to spare, draft tight
    A, B = seq(1, 8), seq(2, 8)
    _, t1, d1 = run_prompt(mgr, "r1", A)
    finish(mgr, "r1", A)
    cached, t2, d2 = run_prompt(mgr, "r2", A + B)
    assert cached == 8
    finish(mgr, "r2", A + B)
    assert probe(mgr, A) == 8  # A used again: B is the least recently used
    assert mgr.cache_counts() == (16, 0, 16, 0)
    assert free(mgr) == (48, 8)

    step(mgr, extends=[("z", 0, 16)])  # target fits; draft needs 8 more: B loses its draft KV
    assert mgr.cache_counts() == (16, 0, 8, 0), "target pages stay, draft evictable goes down"
    assert free(mgr) == (32, 0)
    assert not mapped(mgr, t2[8:]).any(), "a tombstone keeps no mapping"
    assert np.array_equal(mapped(mgr, t1), d1), "A keeps its draft KV"

    m = match(mgr, "r5", A + B)
    assert m.cached_len == 8 == len(A + B) - W, "the dead window of A+B falls back to A"
    assert np.array_equal(m.target_slots, t2[:8]) and np.array_equal(m.draft_slots, d1)
    finish(mgr, "z")
    # tombstone revival: prefill B again and cache it
    [a] = step(mgr, extends=[("r5", 8, 8)])
    t5, d5 = a.target_slots.astype(np.int64), a.draft_slots.astype(np.int64)
    before = free(mgr)
    finish(mgr, "r5", A + B)
    after = free(mgr)
    assert after[0] == before[0] + 8, "r5's duplicate target pages go back to the pool"
    assert after[1] == before[1], "r5's draft pages become B's"
    assert mgr.cache_counts() == (16, 0, 16, 0)
    assert np.array_equal(mapped(mgr, t2[8:]), d5), "B's target slots map to the revived draft KV"
    assert not mapped(mgr, t5).any()
    m = match(mgr, "r6", A + B)
    assert m.cached_len == 16
    assert np.array_equal(m.target_slots, t2) and np.array_equal(m.draft_slots[8:], d5)
    finish(mgr, "r6")
    assert mgr.flush_cache() == (16, 16)
    assert_all_free(mgr)


@pages
def test_draft_eviction_skips_a_protected_window(P):
    mgr = make(P, BOUNDED, target=64, draft=24)
    A, B = seq(1, 8), seq(2, 8)
    run_prompt(mgr, "r1", A)
    finish(mgr, "r1", A)
    assert match(mgr, "lockA", A).cached_len == 8  # A's window is protected from now on
    run_prompt(mgr, "r2", B)
    finish(mgr, "r2", B)  # B is used after A: A is the least recently used, but locked
    assert mgr.cache_counts() == (8, 8, 8, 8)
    before = snapshot(mgr)
    with pytest.raises(ResourceExhausted):
        mgr.step("s", Release(), extends=[("z", 0, 24)])  # draft: 8 free + 8 evictable
    assert_unchanged(before, snapshot(mgr))
    step(mgr, extends=[("z", 0, 16)])
    assert mgr.cache_counts() == (8, 8, 0, 8), "B lost its draft KV, the protected A kept it"
    assert probe(mgr, B) == 0
    finish(mgr, "lockA")
    assert probe(mgr, A) == 8
    finish(mgr, "z")
    mgr.flush_cache()
    assert_all_free(mgr)


# ---- out-of-window trims ----------------------------------------------------------------------------


@pages
def test_out_of_window_trims_never_free_cache_owned_draft_pages(P):
    mgr = make(P, BOUNDED, target=64, draft=48, trim_gap=0)
    A, C = seq(1, 16), seq(2, 16)
    _, t1, d1 = run_prompt(mgr, "r1", A)
    finish(mgr, "r1", A)
    m = match(mgr, "r2", A + C)
    assert m.cached_len == 16
    assert np.array_equal(m.draft_slots[8:], d1[8:]) and not m.draft_slots[:8].any()
    t2, d2 = list(m.target_slots), list(m.draft_slots)
    [a] = step(mgr, extends=[("r2", 16, 4)])
    t2 += list(a.target_slots)
    d2 += list(a.draft_slots)
    free_d = free(mgr)[1]
    step(mgr, "s", Release(trims=("r2",)))  # frontier 12: inside the cached part
    assert free(mgr)[1] == free_d, "a trim inside the cached prefix frees nothing"
    assert np.array_equal(mapped(mgr, t1), d1), "the cache keeps its draft KV and mapping"
    [g] = step(mgr, grows=[("r2", 12)])
    t2 += list(g.target_slots)
    d2 += list(g.draft_slots)
    free_d = free(mgr)[1]
    assert mgr.cache_counts() == (0, 16, 16 - W, W), "the window still overlaps the cached prefix's last W tokens"
    step(mgr, "s", Release(trims=("r2",)))  # frontier 24: frees r2's own [16, 24)
    assert free(mgr)[1] == free_d + 8
    assert np.array_equal(mapped(mgr, t1), d1)
    assert mgr.cache_counts() == (0, 16, 16, 0), "the window left the cached prefix: its draft KV is evictable"
    t2, d2 = np.array(t2), np.array(d2)

    finish(mgr, "r2", A + C)
    assert mgr.cache_counts() == (32, 0, 24, 0), "C's trimmed pages are cached as tombstones"
    assert not mapped(mgr, t2[16:24]).any()
    assert np.array_equal(mapped(mgr, t2[24:]), d2[24:])
    assert np.array_equal(mapped(mgr, t1), d1)
    m = match(mgr, "r3", A + C)
    assert m.cached_len == 32 and np.array_equal(m.draft_slots[24:], d2[24:])
    assert match(mgr, "r4", A + C[:8]).cached_len == 16, "the window of the first 24 tokens is dead"
    finish(mgr, "r3")
    finish(mgr, "r4")
    mgr.flush_cache()
    assert_all_free(mgr)


# ---- finishing without insert, lost sessions ---------------------------------------------------------


@pages
@modes
def test_a_match_that_finishes_without_insert_leaves_the_cache_unchanged(P, mode):
    mgr = make(P, mode, sessions=(("s", True), ("t", True)))
    A = seq(1, 16)
    run_prompt(mgr, "r1", A)
    finish(mgr, "r1", A)
    before = snapshot(mgr)
    match(mgr, "r2", A)
    finish(mgr, "r2")
    assert_unchanged(before, snapshot(mgr))
    match(mgr, "r3", A)
    finish(mgr, "r3", A)  # only matched: inserting its tokens adds nothing
    assert_unchanged(before, snapshot(mgr))
    match(mgr, "r4", A[:8])
    finish(mgr, "r4", A[:8])  # splits the node, changes no page or count
    assert mgr.cache_counts() == before["counts"]
    assert free(mgr)[0] == len(before["target_free"]) * P

    # a lost session unlocks its match and caches nothing it prefilled
    cached, _, _ = run_prompt(mgr, "r5", A + seq(2, 8), session="t")
    assert cached == 16
    mgr.close_session("t")
    check_structure(mgr)
    assert mgr.cache_counts() == before["counts"]
    assert free(mgr)[0] == len(before["target_free"]) * P
    assert probe(mgr, A + seq(2, 8)) == 16
    mgr.flush_cache()
    assert_all_free(mgr)


# ---- flush -----------------------------------------------------------------------------------------


@pages
@modes
def test_flush_only_when_idle_and_then_everything_is_free(P, mode):
    mgr = make(P, mode)
    A, B = seq(1, 16), seq(2, 11)
    for rid, toks in (("r1", A), ("r2", B)):
        run_prompt(mgr, rid, toks)
        finish(mgr, rid, toks)
    match(mgr, "m", A)
    before = snapshot(mgr)
    with pytest.raises(FailedPrecondition):
        mgr.flush_cache()
    assert_unchanged(before, snapshot(mgr))
    finish(mgr, "m")
    step(mgr, extends=[("plain", 0, 3)])  # a request without a match blocks a flush too
    with pytest.raises(FailedPrecondition):
        mgr.flush_cache()
    finish(mgr, "plain")
    cached = 16 + floor(11, P)
    assert mgr.flush_cache() == (cached, cached if mode is not NONE else 0)
    assert_all_free(mgr)
    assert probe(mgr, A) == 0
    assert mgr.flush_cache() == (0, 0)
    assert_all_free(mgr)


# ---- clients that write no draft KV ----------------------------------------------------------------


@pages
def test_a_session_without_draft_writes_in_a_bounded_pool(P):
    mgr = make(P, BOUNDED, target=96, draft=48, sessions=(("s", True), ("n", False)))
    Q, R = seq(1, 32), seq(2, 16)
    _, tq, _ = run_prompt(mgr, "q", Q)
    step(mgr, "s", Release(trims=("q",)))  # frontier 24: only the last window keeps draft KV
    finish(mgr, "q", Q)
    assert mgr.cache_counts() == (32, 0, 8, 0)
    assert probe(mgr, Q[:16]) == 0, "a draft writer needs a live window"
    m = match(mgr, "n1", Q[:16], session="n")
    assert m.cached_len == 16 and not m.draft_slots.any(), "liveness does not matter without draft writes"
    assert np.array_equal(m.target_slots, tq[:16])
    assert mgr.cache_counts() == (16, 16, 8, 0), "and it protects no draft KV"
    finish(mgr, "n1", session="n")

    free_d, ev_d = free(mgr)[1], mgr.cache_counts()[2]
    _, tr, _ = run_prompt(mgr, "n2", R, session="n")
    finish(mgr, "n2", R, session="n")
    assert free(mgr)[1] == free_d, "its draft pages go back to the pool"
    assert mgr.cache_counts()[2] == ev_d, "no draft KV of it is cached"
    assert mgr.cache_counts()[0] == 48
    assert not mapped(mgr, tr).any()
    assert probe(mgr, R) == 0
    assert probe(mgr, R, session="n") == 16
    mgr.flush_cache()
    assert_all_free(mgr)


@pages
def test_a_session_without_draft_writes_caches_nothing_with_identity_drafts(P):
    mgr = make(P, IDENTITY, sessions=(("s", True), ("n", False)))
    A, R = seq(1, 16), seq(2, 16)
    run_prompt(mgr, "a", A)
    finish(mgr, "a", A)
    m = match(mgr, "n1", A + R, session="n")  # it may use what a draft writer cached
    assert m.cached_len == 16 and np.array_equal(m.draft_slots, m.target_slots)
    step(mgr, "n", extends=[("n1", 16, 16)])
    before = mgr.cache_counts(), free(mgr)
    finish(mgr, "n1", A + R, session="n")
    assert mgr.cache_counts() == (16, 0, 16, 0), "nothing of it is cached, the matched prefix is unlocked"
    assert free(mgr)[0] == before[1][0] + 16, "its own pages go back to the pool"
    assert probe(mgr, A + R) == 16
    assert probe(mgr, A + R, session="n") == 16
    mgr.flush_cache()
    assert_all_free(mgr)


# ---- commits ---------------------------------------------------------------------------------------


@pages
@modes
def test_commit_below_the_cached_length_is_rejected(P, mode):
    mgr = make(P, mode)
    A = seq(1, 16)
    run_prompt(mgr, "r1", A)
    finish(mgr, "r1", A)
    assert match(mgr, "r2", A + [7] * 8).cached_len == 16
    step(mgr, extends=[("r2", 16, 6)])
    before = snapshot(mgr)
    for bad in (15, 8, 0):
        with pytest.raises(InvalidArgument):
            mgr.step("s", Release(commits=(("r2", bad),)))
        assert_unchanged(before, snapshot(mgr))
    step(mgr, "s", Release(commits=(("r2", 16),)))
    assert mgr.held_tokens()[0] == 0
    finish(mgr, "r2")
    mgr.flush_cache()
    assert_all_free(mgr)


# ---- inserts must agree with the matched prefix ----------------------------------------------------


@pages
@modes
@pytest.mark.parametrize("finishing", [True, False], ids=["finish", "checkpoint"])
def test_insert_with_tokens_that_disagree_with_the_matched_prefix_is_rejected(P, mode, finishing):
    """A request holds cache-owned pages for its matched prefix; caching it under other tokens
    would give those pages a second owner. memd must refuse the release (and change nothing)."""
    mgr = make(P, mode)
    A, B = seq(1, 8), seq(2, 16)
    run_prompt(mgr, "r1", A)
    finish(mgr, "r1", A)
    assert match(mgr, "r2", A + seq(3, 8)).cached_len == 8
    step(mgr, extends=[("r2", 8, 8)])
    before = snapshot(mgr)
    with pytest.raises(InvalidArgument):
        mgr.step("s", Release(finishes=("r2",) if finishing else (), inserts=(("r2", tuple(B)),)))
    assert_unchanged(before, snapshot(mgr))
    check_structure(mgr)
    finish(mgr, "r2", A + seq(3, 8))
    assert probe(mgr, A + seq(3, 8)) == 16
    mgr.flush_cache()
    assert_all_free(mgr)


# ---- checkpoints: cache ops of running requests -------------------------------------------------------


@pages
@modes
def test_a_checkpoint_caches_a_running_requests_prefix(P, mode):
    mgr = make(P, mode)
    A = seq(1, 16)
    _, t1, d1 = run_prompt(mgr, "r1", A + seq(2, 3))
    held = mgr.held_tokens()
    step(mgr, "s", Release(inserts=(("r1", tuple(A)),)))
    assert mgr.cache_counts()[:2] == (0, 16), "its own pages became the cache's, locked by it"
    assert mgr.held_tokens()[0] == held[0] - 16
    assert np.array_equal(mgr.req_to_token[mgr.sessions["s"]["r1"].row, :19], t1), "it keeps its slots"
    m = match(mgr, "r2", A)
    assert m.cached_len == 16 and np.array_equal(m.target_slots, t1[:16])
    before = snapshot(mgr)
    with pytest.raises(InvalidArgument):
        mgr.step("s", Release(commits=(("r1", 15),)))  # below its (new) cached length
    assert_unchanged(before, snapshot(mgr))
    finish(mgr, "r1")  # no insert: the checkpointed prefix stays cached
    finish(mgr, "r2")
    assert mgr.cache_counts()[:2] == (16, 0)
    assert probe(mgr, A) == 16
    mgr.flush_cache()
    assert_all_free(mgr)


@pages
@modes
def test_a_checkpoint_of_tokens_already_cached_moves_the_request_onto_the_cache_pages(P, mode):
    mgr = make(P, mode)
    A = seq(1, 16)
    _, t1, _ = run_prompt(mgr, "r1", A)
    _, t2, _ = run_prompt(mgr, "r2", A + seq(2, 3))  # prefilled the same tokens itself
    finish(mgr, "r1", A)
    before = free(mgr)
    step(mgr, "s", Release(inserts=(("r2", tuple(A)),)))
    assert free(mgr)[0] == before[0] + 16, "its duplicate pages go back to the pool"
    row = mgr.sessions["s"]["r2"].row
    assert np.array_equal(mgr.req_to_token[row, :16], t1[:16]), "it reads the cache's pages now"
    assert np.array_equal(mgr.req_to_token[row, 16:19], t2[16:])
    assert mgr.cache_counts()[:2] == (0, 16)
    finish(mgr, "r2", A + seq(2, 3))
    assert mgr.cache_counts()[:2] == (floor(19, P), 0)
    mgr.flush_cache()
    assert_all_free(mgr)


@pages
def test_a_checkpoint_keeps_the_prompt_window_cached_through_a_long_generation(P):
    mgr = make(P, BOUNDED, target=96, draft=64, trim_gap=0)
    A = seq(1, 16)
    _, t1, d1 = run_prompt(mgr, "r1", A)
    step(mgr, "s", Release(inserts=(("r1", tuple(A)),)))
    assert mgr.cache_counts() == (0, 16, 0, 16)
    step(mgr, grows=[("r1", 24)])
    step(mgr, "s", Release(trims=("r1",)))  # frontier 32: past the checkpoint
    assert np.array_equal(mapped(mgr, t1), d1), "the cache kept the prompt's draft KV"
    assert mgr.cache_counts() == (0, 16, 16, 0), "no longer in the request's window: evictable"
    finish(mgr, "r1")
    m = match(mgr, "r2", A)
    assert m.cached_len == 16 and np.array_equal(m.draft_slots[8:], d1[8:])
    finish(mgr, "r2")
    mgr.flush_cache()
    assert_all_free(mgr)


@pages
@draft_modes
def test_a_checkpoint_without_draft_writes_is_a_no_op(P, mode):
    """A client that writes no draft KV: its checkpoint would cache invalid draft KV, so nothing happens."""
    mgr = make(P, mode, sessions=(("s", True), ("n", False)))
    A = seq(1, 16)
    run_prompt(mgr, "r1", A, session="n")
    before = snapshot(mgr)
    step(mgr, "n", Release(inserts=(("r1", tuple(A)),)))
    assert_unchanged(before, snapshot(mgr))
    finish(mgr, "r1", session="n")
    mgr.flush_cache()
    assert_all_free(mgr)


# ---- feasibility of a step with a release: exact, and atomic -----------------------------------------


@pages
def test_a_checkpoint_and_an_allocation_in_one_step_is_atomic(P):
    """The checkpoint protects r2's window of the cached A (the draft KV of [8, 16)) and hands back r2's own draft
    pages there as duplicates: the draft side then has 8 free, 8 handed back and A's [0, 8) evictable, 24 in all.
    A check that counted wrongly once let an allocation pass whose eviction then fell short, and step() raised
    InvariantViolation after the checkpoint had taken effect (memd 19d0028). Expected for 28: ResourceExhausted,
    nothing changed; 24 fit."""
    mgr = make(P, BOUNDED, target=96, draft=32)
    A = seq(1, 16)
    run_prompt(mgr, "r1", A)
    finish(mgr, "r1", A)  # A: 16 target pages, 16 live draft pages, evictable
    step(mgr, extends=[("r2", 0, 16)])  # r2 prefills A itself (no match)
    step(mgr, "s", Release(trims=("r2",)))  # frontier 8: r2 keeps draft KV for [8, 16)
    assert mgr.cache_counts() == (16, 0, 16, 0) and free(mgr) == (64, 8)
    before = snapshot(mgr)
    with pytest.raises(ResourceExhausted):
        mgr.step("s", Release(inserts=(("r2", tuple(A)),)), extends=[("x", 0, 28)])
    assert_unchanged(before, snapshot(mgr))
    check_structure(mgr)
    step(mgr, "s", Release(inserts=(("r2", tuple(A)),)), extends=[("x", 0, 24)])
    check_structure(mgr)


@pages
def test_a_trim_that_unprotects_cached_draft_kv_counts_for_the_allocation_of_its_step(P):
    """A trim whose window leaves the cached prefix makes that prefix's draft KV evictable (release_draft);
    the allocation of the same step may use it (memd 19d0028 refused the step although the same release
    followed by the same allocation succeeds)."""
    mgr = make(P, BOUNDED, target=96, draft=32)
    A = seq(1, 16)
    run_prompt(mgr, "r1", A)
    finish(mgr, "r1", A)
    assert match(mgr, "r2", A + seq(2, 16)).cached_len == 16  # draft-protects A
    step(mgr, extends=[("r2", 16, 8)])  # length 24: the next trim moves the window to [16, 24)
    assert mgr.cache_counts() == (0, 16, 16 - W, W) and free(mgr)[1] == 8  # the window's draft KV protected
    # 8 free, A's [0, 8) evictable, and its window's [8, 16) evictable only once the trim's release counts
    step(mgr, "s", Release(trims=("r2",)), extends=[("x", 0, 24)])
    assert probe(mgr, A) == 0, "A lost its draft KV to x"


@pages
@modes
def test_a_checkpoint_that_frees_duplicates_counts_for_the_allocation_of_its_step(P, mode):
    """A checkpoint onto pages the cache already holds (and another request protects) frees the request's
    duplicate pages; the allocation of the same step may use them (memd 19d0028 counted a checkpoint as
    freeing nothing)."""
    mgr = make(P, mode, target=48, draft=48)
    A = seq(1, 16)
    run_prompt(mgr, "r1", A)
    finish(mgr, "r1", A)
    assert match(mgr, "r3", A).cached_len == 16  # protects A
    step(mgr, extends=[("r2", 0, 16)])  # r2 prefills A itself
    assert free(mgr)[0] == 16
    step(mgr, "s", Release(inserts=(("r2", tuple(A)),)), extends=[("x", 0, 32)])  # 16 free + r2's 16 duplicates


@pages
def test_a_checkpoint_after_a_trim_within_the_cached_prefix_counts_for_the_allocation_of_its_step(P):
    """r2 matched A (its lock protects A's draft KV over the window [8, 16)); a trim to 12 leaves its window
    inside A, so that protection stays. A checkpoint locks again from the window's start (12): A's draft KV
    at [8, 12) turns evictable, and the allocation of the same step may use it, as it may after the same
    release alone."""
    mgr = make(P, BOUNDED, target=96, draft=24)
    A, B = seq(1, 16), seq(2, 4)
    run_prompt(mgr, "r1", A)
    finish(mgr, "r1", A)
    assert match(mgr, "r2", A + B).cached_len == 16
    step(mgr, extends=[("r2", 16, 4)])
    step(mgr, "s", Release(trims=("r2",)))  # window [12, 20)
    assert mgr.cache_counts()[2:] == (8, 8) and free(mgr)[1] == 4
    step(mgr, "s", Release(inserts=(("r2", tuple(A + B)),)), extends=[("x", 0, 16)])  # 4 free + 8 + 4 evictable
    assert mgr.cache_counts() == (0, 20, 0, 8)
    for rid in ("x", "r2"):
        finish(mgr, rid)
    mgr.flush_cache()
    assert_all_free(mgr)


@pages
@pytest.mark.xfail(
    strict=True,
    reason="known conservative case: a checkpoint and a trim of the same request in "
    "one release are not counted as unprotecting the checkpointed draft KV, so memd refuses the "
    "allocation of that step (safe; the next step sees the pages evictable)",
)
def test_a_checkpoint_and_a_trim_past_it_in_one_step_count_for_its_allocation(P):
    """BUG (memd 1dffa79, a spurious RESOURCE_EXHAUSTED): r2 checkpoints its first 16 tokens and, in the
    same release, trims its window past them: the checkpointed draft KV is then unprotected (evictable),
    so the allocation of the same step fits, as it does after the same release alone. The check ignores
    a trim's release of draft protection when the same release checkpoints that request."""
    mgr = make(P, BOUNDED, target=96, draft=32)
    A = seq(1, 24)
    step(mgr, extends=[("r2", 0, 24)])  # draft: 24 held, 8 free
    release = Release(trims=("r2",), inserts=(("r2", tuple(A[:16])),))  # cache [0, 16), then window [16, 24)
    step(mgr, "s", release, extends=[("x", 0, 24)])  # 8 free + the 16 the checkpoint caches and the trim unprotects
    assert mgr.cache_counts() == (0, 16, 0, 0), "A's draft KV was evicted for x"
    finish(mgr, "x")
    finish(mgr, "r2")
    mgr.flush_cache()
    assert_all_free(mgr)


@pages
@modes
@pytest.mark.xfail(
    strict=True,
    reason="known conservative case: two checkpoints that lock the same cached "
    "pages in one release subtract those pages twice from what the step may evict, so memd refuses "
    "the allocation of that step (safe; the next step counts them once)",
)
def test_two_checkpoints_of_the_same_tokens_in_one_step_count_for_its_allocation(P, mode):
    """BUG (memd 1dffa79, a spurious RESOURCE_EXHAUSTED): r1 and r2 prefilled the same 8 tokens and both
    checkpoint them in one release: r1's pages go into the cache, r2's are then duplicates and go back to
    the pools, so the allocation of the same step fits, as it does after the same release alone. The
    check looks for duplicates in the tree as it was before the release, so it counts none. (The same for
    two checkpoints that newly lock one evictable node: each subtracts it.)"""
    mgr = make(P, mode, target=32, draft=32)
    A = seq(1, 8)
    step(mgr, extends=[("r1", 0, 8), ("r2", 0, 8)])  # 16 free on each side
    release = Release(inserts=(("r1", tuple(A)), ("r2", tuple(A))))
    step(mgr, "s", release, extends=[("x", 0, 24)])  # 16 free + r2's 8 duplicates
    assert mgr.cache_counts()[:2] == (0, 8)
    for rid in ("x", "r1", "r2"):
        finish(mgr, rid)
    mgr.flush_cache()
    assert_all_free(mgr)


# ---- randomized: a state machine over prompts that share prefixes, with fake KV content ---------------


@dataclass(frozen=True)
class MCfg:
    P: int
    mode: DraftMode
    target: int  # tokens
    draft: int
    ctx: int
    window: int = W
    trim_gap: int = 0
    max_requests: int = 4


@dataclass
class Req:
    session: str
    rid: str
    row: int
    seq: list  # its tokens at every position it may reach (prompt, then decoded tokens)
    length: int
    cached: int  # matched prefix (cache-owned)
    draft_start: int  # model of the first position whose draft KV it keeps
    prompt_len: int = 0


# A step's feasibility check is exact: when it refuses, the same release alone followed by the same
# allocations is refused too. Known exceptions (memd 1dffa79; the unit tests
# test_a_checkpoint_and_a_trim_past_it_in_one_step_... and test_two_checkpoints_of_the_same_tokens_...):
# a release that checkpoints a request and trims it, or that checkpoints more than one request. While
# this is True the machine tolerates a refusal there, and only there.
TOLERATE_KNOWN_INEXACT = True

POISON = -1  # draft KV a client that writes none leaves behind: never to be served


class PrefixMachine(RuleBasedStateMachine):
    CFG: MCfg = None

    def __init__(self):
        super().__init__()
        c = self.cfg = self.CFG
        self.P = c.P
        self.mgr = make(
            c.P,
            c.mode,
            target=c.target,
            draft=c.draft,
            window=c.window,
            trim_gap=c.trim_gap,
            max_requests=c.max_requests,
            ctx=c.ctx,
            sessions=(("a", True), ("b", False)),
        )
        self.writes_draft = {"a": True, "b": False}
        rows = (c.target // c.P + 1) * c.P
        self.tkv = np.zeros(rows, np.int64)
        self.dkv = np.zeros(((c.draft if c.mode is BOUNDED else c.target) // c.P + 1) * c.P, np.int64)
        self.reqs: dict[tuple[str, str], Req] = {}
        self.inserted: set[tuple] = set()  # page-aligned prefixes of every sequence cached since the last flush
        self.names = itertools.count()
        self.bases = [[b * 1000 + i + 1 for i in range(c.ctx)] for b in range(3)]
        self.past: list[list[int]] = []
        self.stepping = False

    # ---- model helpers ----
    @property
    def bounded(self):
        return self.cfg.mode is BOUNDED

    def kv(self, tokens, start):
        return np.asarray(tokens, np.int64) * 100000 + np.arange(start, start + len(tokens))

    def frontier(self, length, ds):
        if not self.bounded:
            return ds
        f = floor(max(0, length - self.cfg.window), self.P)
        return f if f - ds >= max(self.cfg.trim_gap, 1) else ds

    def bound(self, tokens) -> int:
        """The longest page-aligned prefix of `tokens` that some cached sequence shares."""
        P, k = self.P, 0
        while (k + 1) * P <= len(tokens) and tuple(tokens[: (k + 1) * P]) in self.inserted:
            k += 1
        return k * P

    def record_insert(self, r: Req, n: int):
        if self.cfg.mode is IDENTITY and not self.writes_draft[r.session]:
            return  # caches nothing
        for k in range(1, n // self.P + 1):
            self.inserted.add(tuple(r.seq[: k * self.P]))

    def draw_prompt(self, data):
        """A stem (a base sequence, or a prompt or cached sequence seen before), cut, plus a short
        suffix from a two-token alphabet: prompts share prefixes, often at non-page-aligned cuts."""
        c = self.cfg
        stems = self.bases + self.past
        stem = stems[data.draw(st.integers(0, len(stems) - 1), label="stem")]
        cut = data.draw(st.one_of(st.just(len(stem)), st.integers(0, len(stem))), label="cut")
        extra = data.draw(st.lists(st.integers(900, 901), max_size=6), label="suffix")
        prompt = (list(stem[:cut]) + extra)[: c.ctx] or list(self.bases[0][:1])
        if len(self.past) < 24:
            self.past.append(prompt)
        return prompt

    def continuation(self, prompt, data):
        seed = data.draw(st.integers(0, 2**16), label="continuation")
        rng = np.random.default_rng(seed)
        return list(prompt) + [int(x) for x in rng.integers(900, 903, self.cfg.ctx - len(prompt))]

    def pick(self, data, pred=lambda r: True):
        keys = sorted(k for k, r in self.reqs.items() if pred(r))
        return self.reqs[data.draw(st.sampled_from(keys), label="request")] if keys else None

    def write(self, r: Req, a):
        t = np.asarray(a.target_slots, np.int64)
        d = np.asarray(a.draft_slots, np.int64)
        assert a.start == r.length and a.row == r.row
        content = self.kv(r.seq[a.start : a.start + len(t)], a.start)
        self.tkv[t] = content
        if self.cfg.mode is not NONE:
            assert d.all(), "every new position gets a draft slot"
            self.dkv[d] = content if self.writes_draft[r.session] else POISON
        r.length += len(t)

    def space(self):
        """Pages each side could hand out without a release: free + evictable."""
        ev_t, _, ev_d, _ = self.mgr.cache_counts()
        t = (self.mgr.target.free_tokens + ev_t) // self.P
        d = (self.mgr.draft.free_tokens + ev_d) // self.P if self.bounded else None
        return t, d

    # ---- checks ----
    def usable(self, tokens, needs_draft: bool) -> int:
        """White box: the match the tree's pages allow, recomputed: the longest cached page prefix of
        `tokens`, and needing draft KV, the longest whose last `window` tokens' pages hold live draft KV."""
        P, node, live = self.P, self.mgr.cache.roots.get(MODEL), []
        while node is not None and len(live) < len(tokens) // P:
            child = node.children.get(tuple(tokens[len(live) * P : (len(live) + 1) * P]))
            if child is None:
                break
            for i in range(len(child.target_pages)):
                at = len(live)
                if at >= len(tokens) // P or tuple(tokens[at * P : (at + 1) * P]) != child.key[i * P : (i + 1) * P]:
                    break
                live.append(bool(child.draft_pages[i]) if child.draft_pages else True)
            else:
                node = child
                continue
            break
        if not needs_draft:
            return len(live) * P
        best = 0
        for p in range(1, len(live) + 1):
            if all(live[max(0, p * P - self.cfg.window) // P : p]):
                best = p
        return best * P

    def check_match(self, r: Req, prompt, m):
        P, L = self.P, m.cached_len
        assert L % P == 0 and L <= floor(len(prompt), P)
        bound = self.bound(prompt)
        assert L <= bound, f"matched {L} tokens, but no cached sequence shares more than {bound}"
        ev_t, prot_t, _, _ = self.mgr.cache_counts()
        nothing_evicted = (ev_t + prot_t) // P == len(self.inserted)
        needs_draft = self.bounded and self.writes_draft[r.session]
        if nothing_evicted and not needs_draft:
            assert L == bound, f"nothing was evicted, yet the match is {L} of {bound}"
        assert L == self.expected_match, f"matched {L}, the cached pages allow {self.expected_match}"
        t, d = np.asarray(m.target_slots, np.int64), np.asarray(m.draft_slots, np.int64)
        want = self.kv(prompt[:L], 0)
        assert np.array_equal(self.tkv[t], want), "a matched target slot holds other KV"
        live = d != 0
        assert np.array_equal(self.dkv[d[live]], want[live]), "a matched draft slot holds other KV"
        if self.cfg.mode is IDENTITY:
            assert np.array_equal(d, t)
        elif self.bounded and self.writes_draft[r.session]:
            ws = floor(max(0, L - self.cfg.window), P)
            assert live[ws:].all(), "the window of a match must hold draft KV"
            assert not live[:ws].any()
        elif self.bounded:
            assert not live.any()

    def check_requests(self):
        mgr = self.mgr
        for r in self.reqs.values():
            t = mgr.req_to_token[r.row, : r.length].astype(np.int64)
            want = self.kv(r.seq[: r.length], 0)
            assert np.array_equal(self.tkv[t], want), f"{r.rid}: its target KV was overwritten"
            if mgr.mapping is None:
                continue
            d = mgr.mapping[t].astype(np.int64)
            if self.cfg.mode is IDENTITY:
                assert np.array_equal(d, t)
            own = np.arange(r.length) >= r.cached
            if self.bounded:
                assert np.array_equal(d[own] != 0, np.arange(r.length)[own] >= r.draft_start), f"{r.rid}: window"
                assert (d[r.draft_start :] != 0).all()
            check = (d != 0) & (~own | self.writes_draft[r.session])
            assert np.array_equal(self.dkv[d[check]], want[check]), f"{r.rid}: its draft KV was overwritten"

    def check_cache(self):
        """Every cached page holds the KV of its node's tokens at its positions (white box)."""
        P = self.P
        for node in self.mgr.cache._nodes():
            pos = np.arange(node.start * P, node.end * P)
            want = self.kv(node.key, node.start * P)
            slots = (np.asarray(node.target_pages, np.int64)[:, None] * P + np.arange(P)).reshape(-1)
            assert np.array_equal(self.tkv[slots], want), f"cached target page at {pos[0]} holds other KV"
            if self.cfg.mode is IDENTITY:
                assert np.array_equal(self.dkv[slots], want), f"cached identity draft at {pos[0]} holds other KV"
            for i, dp in enumerate(node.draft_pages):
                if dp:
                    ds = dp * P + np.arange(P)
                    assert np.array_equal(self.dkv[ds], want[i * P : (i + 1) * P]), "cached draft page holds other KV"

    def check_all(self):
        check_structure(self.mgr)
        self.check_requests()
        self.check_cache()

    # ---- one step, atomically ----
    def do_step(self, session, commits=(), trims=(), finishes=(), inserts=(), extends=(), grows=(), news=()):
        """news: {rid: (prompt, seq)} for extends of new requests."""
        mgr = self.mgr
        self.stepping = True  # until the step and its checks are done (teardown skips a failed run)
        release = Release(tuple(commits), tuple(trims), tuple(finishes), tuple(inserts))
        before = snapshot(mgr)
        space = self.space()
        need = 0
        for rid, start, n in extends:
            need += -(-(start + n) // self.P) - -(-start // self.P)
        for rid, n in grows:
            length = self.reqs[(session, rid)].length
            length = dict(commits).get(rid, length)
            need += -(-(length + n) // self.P) - -(-length // self.P)
        plain = not (commits or trims or finishes or inserts)
        counts = mgr.cache_counts()
        try:
            out = mgr.step(session, release, extends=list(extends), grows=list(grows))
        except ResourceExhausted:
            event("step refused" + (" (plain)" if plain else " (with a release)"))
            assert_unchanged(before, snapshot(mgr))
            self.check_all()
            if plain:
                rows = len(mgr.free_rows) < len(news)
                assert rows or need > space[0] or (space[1] is not None and need > space[1]), (
                    f"refused {need} pages with {space} free or evictable"
                )
            else:
                # feasibility is exact: the same release alone, then the same allocations, are refused too
                counts, pools = mgr.cache_counts(), free(mgr)
                mgr.step(session, release)
                self.apply_release(session, release)
                self.check_all()
                try:
                    out = mgr.step(session, Release(), extends=list(extends), grows=list(grows))
                except ResourceExhausted:
                    pass
                else:
                    checkpoints = set(dict(release.inserts)) - set(finishes)
                    known = len(checkpoints) > 1 or set(release.trims) & checkpoints
                    assert TOLERATE_KNOWN_INEXACT and known, (
                        f"step({release}, extends={extends}, grows={grows}) was refused, but the release alone and then"
                        f" the allocations succeed (before: cache counts {counts}, free {pools})"
                    )
                    event("known spurious refusal (checkpoints)")
                    for (rid, _), a in zip([(rid, 0) for rid, _, _ in extends] + [(rid, 0) for rid, _ in grows], out):
                        if (session, rid) not in self.reqs:
                            prompt, full = news[rid]
                            self.reqs[(session, rid)] = Req(session, rid, a.row, full, 0, 0, 0, len(prompt))
                        self.write(self.reqs[(session, rid)], a)
                self.check_all()
            self.stepping = False
            return False
        if plain:
            assert need <= space[0] and (space[1] is None or need <= space[1])
            after = mgr.cache_counts()
            if after[0] + after[1] < counts[0] + counts[1]:
                event("target eviction")
            elif self.bounded and after[2] + after[3] < counts[2] + counts[3]:
                event("draft-only eviction")
        self.apply_release(session, release)
        allocs = [(rid, start) for rid, start, _ in extends] + [(rid, None) for rid, _ in grows]
        assert len(out) == len(allocs)
        for (rid, _), a in zip(allocs, out):
            if (session, rid) not in self.reqs:
                prompt, full = news[rid]
                self.reqs[(session, rid)] = Req(session, rid, a.row, full, 0, 0, 0, len(prompt))
            self.write(self.reqs[(session, rid)], a)
        self.check_all()
        self.stepping = False
        return True

    def apply_release(self, session, release):
        for rid, c in release.commits:
            r = self.reqs[(session, rid)]
            r.length = c
            rng = np.random.default_rng(len(r.seq) * 7 + c)
            r.seq[c:] = [int(x) for x in rng.integers(900, 903, len(r.seq) - c)]  # the rejected tail is redrawn
        inserts = dict(release.inserts)
        for rid, tokens in release.inserts:  # checkpoints: cache ops of requests that keep running
            r = self.reqs.get((session, rid))
            if rid in release.finishes or r is None:
                continue
            if (self.cfg.mode is NONE or self.writes_draft[session]) and floor(len(tokens), self.P) > r.cached:
                r.cached = floor(len(tokens), self.P)
                self.record_insert(r, len(tokens))
                event("checkpoint")
        for rid in release.trims:
            r = self.reqs[(session, rid)]
            r.draft_start = self.frontier(r.length, r.draft_start)
        for rid in release.finishes:
            r = self.reqs.pop((session, rid))
            if rid in inserts:
                self.record_insert(r, len(inserts[rid]))
                if len(self.past) < 24:
                    self.past.append(list(inserts[rid]))
                event("insert")

    # ---- rules ----
    def sessions(self):
        return ["a", "b"] if self.cfg.mode is not NONE else ["a"]

    @initialize(data=st.data())
    def warm_cache(self, data):
        """Start with a few cached prompts (as a draft writer), so that matches hit from the first step."""
        for _ in range(data.draw(st.integers(0, 3), label="warm prompts")):
            prompt = self.draw_prompt(data)
            rid = f"r{next(self.names)}"
            if self.do_step(
                "a", extends=[(rid, 0, len(prompt))], news={rid: (prompt, self.continuation(prompt, data))}
            ):
                self.do_step("a", finishes=[rid], inserts=[(rid, tuple(prompt))])

    @rule(data=st.data())
    def new_matched(self, data):
        session = data.draw(st.sampled_from(self.sessions()), label="session")
        prompt = self.draw_prompt(data)
        rid = f"r{next(self.names)}"
        if len(self.reqs) >= self.cfg.max_requests:
            before = snapshot(self.mgr)
            with pytest.raises(ResourceExhausted):
                self.mgr.match_prefix(session, rid, prompt)
            assert_unchanged(before, snapshot(self.mgr))
            return
        self.stepping = True
        self.expected_match = self.usable(prompt, self.bounded and self.writes_draft[session])
        m = self.mgr.match_prefix(session, rid, prompt)
        L = m.cached_len
        if self.cfg.mode is IDENTITY:
            ds = 0
        elif self.bounded and self.writes_draft[session]:
            ds = floor(max(0, L - self.cfg.window), self.P)
        else:
            ds = L
        r = self.reqs[(session, rid)] = Req(session, rid, m.row, self.continuation(prompt, data), L, L, ds)
        self.check_match(r, prompt, m)
        r.prompt_len = len(prompt)
        bound = self.bound(prompt)
        if bound:
            event(
                "match: all of the cached prefix"
                if L == bound
                else "match: less than the cached prefix"
                if L
                else "match: none, although a prefix was cached (evicted or dead window)"
            )
            if L == floor(len(prompt), self.P):
                event("match: the whole prompt")
        self.check_all()
        self.stepping = False
        if L < len(prompt) and data.draw(st.booleans(), label="prefill now"):
            self.do_step(session, extends=[(rid, L, len(prompt) - L)])

    @rule(data=st.data())
    def new_unmatched(self, data):
        session = data.draw(st.sampled_from(self.sessions()), label="session")
        prompt = self.draw_prompt(data)
        rid = f"r{next(self.names)}"
        self.do_step(session, extends=[(rid, 0, len(prompt))], news={rid: (prompt, self.continuation(prompt, data))})

    @precondition(lambda self: any(r.length < self.cfg.ctx for r in self.reqs.values()))
    @rule(data=st.data())
    def extend(self, data):
        r = self.pick(data, lambda r: r.length < self.cfg.ctx)
        n = data.draw(st.integers(1, min(self.cfg.ctx - r.length, 3 * self.P + 3)), label="n")
        if data.draw(st.booleans(), label="as grow"):
            self.do_step(r.session, grows=[(r.rid, n)])
        else:
            self.do_step(r.session, extends=[(r.rid, r.length, n)])

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def commit(self, data):
        r = self.pick(data)
        low = max(r.cached, r.draft_start)
        if data.draw(st.integers(0, 5), label="bad commit") == 0 and low > 0:
            c = data.draw(st.integers(0, low - 1), label="commit below")
            before = snapshot(self.mgr)
            with pytest.raises(InvalidArgument):
                self.mgr.step(r.session, Release(commits=((r.rid, c),)))
            assert_unchanged(before, snapshot(self.mgr))
            return
        c = data.draw(st.integers(low, r.length), label="commit to")
        self.do_step(r.session, commits=[(r.rid, c)])

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def trim(self, data):
        r = self.pick(data)
        self.do_step(r.session, trims=[r.rid])

    def insert_len(self, data, r):
        how = data.draw(st.sampled_from(["none", "all", "prompt", "some"]), label="insert")
        if how == "none":
            return None
        if how == "all":
            return r.length
        if how == "prompt":
            return min(r.length, getattr(r, "prompt_len", r.length))
        return data.draw(st.integers(0, r.length), label="insert len")

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def finish(self, data):
        r = self.pick(data)
        n = self.insert_len(data, r)
        inserts = ((r.rid, tuple(r.seq[:n])),) if n is not None else ()
        self.do_step(r.session, finishes=[r.rid], inserts=inserts)

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def checkpoint(self, data):
        """Cache a running request's prefix (it keeps running, now on the cache's pages)."""
        r = self.pick(data)
        n = data.draw(
            st.one_of(st.just(r.length), st.just(min(r.length, r.prompt_len)), st.integers(0, r.length)),
            label="checkpoint len",
        )
        self.do_step(r.session, inserts=[(r.rid, tuple(r.seq[:n]))])

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def batched(self, data):
        """Commits, trims, finishes (with inserts) and allocations of one session in one call."""
        session = data.draw(st.sampled_from(sorted({r.session for r in self.reqs.values()})), label="session")
        mine = sorted(rid for (s, rid) in self.reqs if s == session)
        chosen = data.draw(st.lists(st.sampled_from(mine), unique=True, min_size=1, max_size=len(mine)), label="rids")
        commits, trims, finishes, inserts, extends, grows, news = [], [], [], [], [], [], {}
        for rid in chosen:
            r = self.reqs[(session, rid)]
            what = data.draw(
                st.sampled_from(
                    [
                        "commit",
                        "trim",
                        "finish",
                        "extend",
                        "grow",
                        "commit+grow",
                        "checkpoint",
                        "checkpoint+trim",
                        "commit+checkpoint+grow",
                    ]
                ),
                label=rid,
            )
            length = r.length
            if what in ("commit", "commit+grow"):
                length = data.draw(st.integers(max(r.cached, r.draft_start), r.length), label="commit to")
                commits.append((rid, length))
            if "checkpoint" in what:
                n = data.draw(st.integers(0, length), label="checkpoint len")
                inserts.append((rid, tuple(r.seq[:n])))
            if "trim" in what:
                trims.append(rid)
            if what == "finish":
                finishes.append(rid)
                n = self.insert_len(data, r)
                if n is not None:
                    inserts.append((rid, tuple(r.seq[:n])))
            if what == "extend" and length < self.cfg.ctx:
                extends.append(
                    (rid, length, data.draw(st.integers(1, min(self.cfg.ctx - length, 3 * self.P + 3)), label="n"))
                )
            if what.endswith("grow") and length < self.cfg.ctx:
                grows.append((rid, data.draw(st.integers(1, min(4, self.cfg.ctx - length)), label="n")))
        if data.draw(st.booleans(), label="plus a new request"):
            prompt = self.draw_prompt(data)
            rid = f"r{next(self.names)}"
            extends.append((rid, 0, len(prompt)))
            news[rid] = (prompt, self.continuation(prompt, data))
        self.do_step(session, commits, trims, finishes, inserts, extends, grows, news)

    @rule(data=st.data())
    def close_session(self, data):
        if data.draw(st.integers(0, 3), label="rare") != 0:
            return
        session = data.draw(st.sampled_from(self.sessions()), label="session")
        self.mgr.close_session(session)
        self.mgr.open_session(session, model=MODEL, writes_draft=self.writes_draft[session])
        for key in [k for k in self.reqs if k[0] == session]:
            del self.reqs[key]
        self.check_all()

    @rule(data=st.data())
    def flush(self, data):
        if data.draw(st.integers(0, 3), label="rare") != 0:
            return
        if self.reqs:
            before = snapshot(self.mgr)
            with pytest.raises(FailedPrecondition):
                self.mgr.flush_cache()
            assert_unchanged(before, snapshot(self.mgr))
            return
        ev_t, prot_t, ev_d, prot_d = self.mgr.cache_counts()
        assert prot_t == prot_d == 0
        assert self.mgr.flush_cache() == (ev_t, ev_d)
        self.inserted.clear()
        assert_all_free(self.mgr)

    def teardown(self):
        if self.stepping:
            return  # a rule failed half way: the model is not the manager's state, report that failure alone
        for session in self.sessions():
            for key in sorted(k for k in self.reqs if k[0] == session):
                self.do_step(session, finishes=[key[1]])
        assert not self.reqs
        self.mgr.flush_cache()
        assert_all_free(self.mgr)


MACHINE_SETTINGS = settings(
    max_examples=40,
    stateful_step_count=40,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)

MACHINES = {
    # tight pools: both target and draft eviction happen often
    "p1_bounded": MCfg(P=1, mode=BOUNDED, target=48, draft=24, ctx=24),
    "p4_bounded": MCfg(P=4, mode=BOUNDED, target=96, draft=36, ctx=32),
    "p4_bounded_gap": MCfg(P=4, mode=BOUNDED, target=96, draft=40, ctx=32, window=6, trim_gap=4),
    "p1_identity": MCfg(P=1, mode=IDENTITY, target=48, draft=0, ctx=24),
    "p4_identity": MCfg(P=4, mode=IDENTITY, target=96, draft=0, ctx=32),
    "p4_none": MCfg(P=4, mode=NONE, target=96, draft=0, ctx=32),
}


def _machine(name: str, cfg: MCfg):
    machine = type(f"PrefixMachine_{name}", (PrefixMachine,), {"CFG": cfg})
    case = machine.TestCase
    case.settings = MACHINE_SETTINGS
    return case


TestMachineP1Bounded = _machine("p1_bounded", MACHINES["p1_bounded"])
TestMachineP4Bounded = _machine("p4_bounded", MACHINES["p4_bounded"])
TestMachineP4BoundedGap = _machine("p4_bounded_gap", MACHINES["p4_bounded_gap"])
TestMachineP1Identity = _machine("p1_identity", MACHINES["p1_identity"])
TestMachineP4Identity = _machine("p4_identity", MACHINES["p4_identity"])
TestMachineP4None = _machine("p4_none", MACHINES["p4_none"])
