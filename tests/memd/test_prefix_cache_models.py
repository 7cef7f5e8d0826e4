"""The prefix cache per model identity (memd.prefix_cache's trees, memd.slots' sessions): KV cached by one model is
never matched by another, even for the same tokens; eviction picks the least recently used node over all models and
drops a tree it empties; flush empties every tree; a session without a model identity neither matches nor caches.
A real SlotManager on CPU, with the strict invariants (check_structure) after every operation."""

import numpy as np
import pytest

from memd.errors import ResourceExhausted
from memd.invariants import check_structure
from memd.slots import Release
from tests.memd.test_prefix_cache import (
    ALL_MODES,
    assert_all_free,
    assert_unchanged,
    finish,
    floor,
    make,
    match,
    probe,
    run_prompt,
    seq,
    snapshot,
    step,
)

MODEL_A, MODEL_B = "model-a", "model-b"

pages = pytest.mark.parametrize("P", [1, 4], ids=["P1", "P4"])
modes = pytest.mark.parametrize("mode", ALL_MODES, ids=lambda m: m.value)


def two_models(P, mode, **sizes):
    """Sessions "a" (MODEL_A), "b" (MODEL_B) and "x" (no model identity), all writing draft KV."""
    mgr = make(P, mode, sessions=(), **sizes)
    for session, model in (("a", MODEL_A), ("b", MODEL_B), ("x", "")):
        mgr.open_session(session, model=model, writes_draft=True)
    check_structure(mgr)
    return mgr


def cache_prompt(mgr, rid, tokens, session):
    """Run `tokens` as a request of `session` and finish it into the cache; its target slots by position."""
    _, target, _ = run_prompt(mgr, rid, tokens, session)
    finish(mgr, rid, tokens, session)
    return target


@pages
@modes
def test_the_same_tokens_of_two_models_never_match_each_other(P, mode):
    mgr = two_models(P, mode)
    tokens = seq(1, 13)
    cached = floor(13, P)
    a_slots = cache_prompt(mgr, "r1", tokens, "a")
    assert probe(mgr, tokens, "b") == 0, "model B matched model A's KV"
    assert probe(mgr, tokens, "a") == cached

    b_slots = cache_prompt(mgr, "r2", tokens, "b")  # B caches the same tokens in its own tree, with its own pages
    assert not set(a_slots[:cached].tolist()) & set(b_slots[:cached].tolist())
    assert mgr.cache_counts()[0] == 2 * cached
    for session, own in (("a", a_slots), ("b", b_slots)):
        m = match(mgr, f"{session}-hit", tokens, session)
        assert m.cached_len == cached and m.target_slots.tolist() == own[:cached].tolist()
        finish(mgr, f"{session}-hit", session=session)
    assert sorted(mgr.cache.roots) == [MODEL_A, MODEL_B]


@pages
@modes
def test_eviction_takes_the_least_recently_used_node_over_all_models(P, mode):
    mgr = two_models(P, mode, target=64, draft=64)
    tokens = seq(1, 24)
    cache_prompt(mgr, "a1", tokens, "a")
    cache_prompt(mgr, "b1", tokens, "b")  # the same tokens, newer
    assert probe(mgr, tokens, "a") == 24  # A's prefix is used again: now B's is the least recently used
    other = seq(2, 32)
    step(mgr, "a", extends=[("big", 0, len(other))])  # 16 tokens free: 16 more must be evicted
    assert probe(mgr, tokens, "b") == 0, "B's older prefix should have gone first"
    assert MODEL_B not in mgr.cache.roots, "an emptied tree is dropped"
    assert probe(mgr, tokens, "a") == 24
    step(mgr, "a", Release(finishes=("big",)))
    mgr.flush_cache()
    assert_all_free(mgr)


@pages
@modes
def test_a_prefix_held_by_one_model_is_not_evicted_for_another(P, mode):
    mgr = two_models(P, mode, target=64, draft=64)
    tokens = seq(1, 24)
    cache_prompt(mgr, "a1", tokens, "a")
    cache_prompt(mgr, "b1", seq(3, 16), "b")
    held = match(mgr, "held", tokens, "a")  # A's prefix is protected while "held" runs
    assert held.cached_len == 24
    before = snapshot(mgr)
    with pytest.raises(ResourceExhausted):  # 24 free + B's 16 evictable < 48
        mgr.step("b", Release(), extends=[("big", 0, 48)])
    assert_unchanged(before, snapshot(mgr))
    step(mgr, "b", extends=[("fits", 0, 40)])  # B's own prefix is evicted; A's held one stays
    assert MODEL_B not in mgr.cache.roots and mgr.cache_counts()[1] == 24
    step(mgr, "b", Release(finishes=("fits",)))
    step(mgr, "a", Release(finishes=("held",)))
    mgr.flush_cache()
    assert_all_free(mgr)


@pages
@modes
def test_flush_empties_the_trees_of_every_model(P, mode):
    mgr = two_models(P, mode)
    cache_prompt(mgr, "a1", seq(1, 13), "a")
    cache_prompt(mgr, "b1", seq(1, 13), "b")
    cache_prompt(mgr, "b2", seq(2, 9), "b")
    freed = mgr.flush_cache()
    check_structure(mgr)
    assert freed[0] == floor(13, P) * 2 + floor(9, P)
    assert mgr.cache.roots == {}
    assert_all_free(mgr)


@pages
@modes
def test_a_session_without_a_model_identity_neither_matches_nor_caches(P, mode):
    mgr = two_models(P, mode)
    tokens = seq(1, 13)
    cache_prompt(mgr, "a1", tokens, "a")
    counts = mgr.cache_counts()
    assert probe(mgr, tokens, "x") == 0
    run_prompt(mgr, "x1", tokens, "x")
    step(mgr, "x", Release(inserts=(("x1", tuple(tokens)),)))  # a checkpoint: ignored
    assert mgr.cache_counts() == counts
    finish(mgr, "x1", tokens, "x")  # a finish with a cache op: its pages go back to the pools
    assert mgr.cache_counts() == counts and sorted(mgr.cache.roots) == [MODEL_A]
    mgr.flush_cache()
    assert_all_free(mgr)


@pages
@modes
def test_a_checkpoint_stays_in_its_own_models_tree(P, mode):
    """A running request of B checkpoints tokens that A has cached: it keeps its own pages (it does not move onto
    A's, as it would onto its own model's), and B's tree gets them."""
    mgr = two_models(P, mode)
    tokens = seq(1, 13)
    a_slots = cache_prompt(mgr, "a1", tokens, "a")
    _, b_slots, _ = run_prompt(mgr, "b1", tokens, "b")
    step(mgr, "b", Release(inserts=(("b1", tuple(tokens)),)))
    row = next(r for r in mgr.requests() if r.rid == "b1").row
    assert np.array_equal(mgr.req_to_token[row, :13], b_slots)
    assert not set(a_slots[: floor(13, P)].tolist()) & set(b_slots.tolist())  # A's cached pages are not B's
    step(mgr, "b", Release(finishes=("b1",)))
    assert probe(mgr, tokens, "b") == floor(13, P) and probe(mgr, tokens, "a") == floor(13, P)
    mgr.flush_cache()
    assert_all_free(mgr)
