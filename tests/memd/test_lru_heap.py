"""memd.lru_heap (the prefix cache's eviction order) on its own, and the prefix cache's eviction through it: least
recently used first, a node touched since its entry found at its new time, non-candidates skipped, the heap bounded
by compaction, and an eviction of a full cache that never walks the trees."""

from dataclasses import dataclass

import pytest

from memd.invariants import check_structure
from memd.lru_heap import LruHeap
from memd.prefix_cache import PrefixCache
from memd.slots import DraftMode, Release
from tests.memd.test_prefix_cache import make, seq


@dataclass(eq=False)
class Item:
    name: str
    last_access: int
    candidate: bool = True


def heap_of(*items: Item) -> LruHeap:
    heap = LruHeap(lambda item: item.candidate)
    for item in items:
        heap.offer(item)
    return heap


def drain(heap: LruHeap) -> list[str]:
    """Pops until empty, evicting each (a candidate no more), as the cache does with what it pops."""
    names = []
    while (item := heap.pop()) is not None:
        item.candidate = False
        names.append(item.name)
    return names


def test_pops_least_recently_used_first_and_ties_in_the_order_offered():
    assert drain(heap_of(Item("c", 3), Item("a", 1), Item("b2", 2), Item("b1", 2))) == ["a", "b2", "b1", "c"]


def test_a_touched_node_is_found_at_its_new_time_once():
    a, b = Item("a", 1), Item("b", 2)
    heap = heap_of(a, b)
    a.last_access = 3  # touched (and offered again, as the cache does at every _account(+1))
    heap.offer(a)
    heap.offer(a)  # offered twice at the same time: still popped once
    assert drain(heap) == ["b", "a"]


def test_a_node_that_stopped_being_a_candidate_is_skipped_and_never_offered_again_unless_it_is_one():
    a, b, c = Item("a", 1), Item("b", 2), Item("c", 3, candidate=False)
    heap = heap_of(a, b, c)
    a.candidate = False  # locked, or became a parent, or was evicted
    assert drain(heap) == ["b"]
    a.candidate = True
    heap.offer(a)
    assert drain(heap) == ["a"]


def test_compaction_keeps_the_heap_bounded_by_its_live_nodes():
    items = [Item(f"n{i}", i) for i in range(100)]
    heap = heap_of(*items)
    for clock in range(100, 20_000):  # every offer a touch: 19,900 stale entries made
        item = items[clock % 100]
        item.last_access = clock
        heap.offer(item)
    assert len(heap.entries) <= 2 * 100 + 64 + 1
    assert heap.current_ids() == {id(item) for item in items}
    assert drain(heap) == [item.name for item in sorted(items, key=lambda item: item.last_access)]


@pytest.mark.parametrize("mode", [DraftMode.BOUNDED, DraftMode.IDENTITY, DraftMode.NONE])
def test_a_full_cache_evicts_without_walking_its_trees(monkeypatch, mode):
    """Admissions into a pool the cache fills, each evicting the least recently used prompt (and, bounded, draft
    KV), with PrefixCache._nodes (the walk over every node) made to fail: eviction does not use it. The strict
    checks (which do walk) run before and after."""
    P = 4
    mgr = make(P, mode, target=64, draft=64, max_requests=4, ctx=64)
    prompts = [seq(tag, 12) for tag in range(1, 6)]  # five prompts of 3 pages each: 15 of the 16 pages
    for i, tokens in enumerate(prompts):
        mgr.match_prefix("s", f"fill{i}", tokens[:8], extend_to=12)
        mgr.apply_release("s", Release(finishes=(f"fill{i}",), inserts=((f"fill{i}", tuple(tokens)),)))
    check_structure(mgr)
    assert mgr.cache_counts()[0] == 60

    def no_walk(self):
        raise AssertionError("eviction walked every node of the prefix cache")

    with monkeypatch.context() as patch:
        patch.setattr(PrefixCache, "_nodes", no_walk)
        for i in range(5):  # each admission needs 3 pages, 1 is free: the least recently used prompt goes
            tokens = seq(10 + i, 12)
            assert mgr.match_prefix("s", f"r{i}", tokens[:8], extend_to=12).extension is not None
            mgr.apply_release("s", Release(finishes=(f"r{i}",), inserts=((f"r{i}", tuple(tokens)),)))
    check_structure(mgr)
    assert mgr.cache_counts()[0] == 60, "each admission evicted one whole prompt, no more"
    for i, tokens in enumerate(prompts):  # the five older prompts went, each before any newer one
        assert mgr.match_prefix("s", f"old{i}", tokens).cached_len == 0
        mgr.apply_release("s", Release(finishes=(f"old{i}",)))
    for i in range(5):
        assert mgr.match_prefix("s", f"new{i}", seq(10 + i, 12)).cached_len == 12
        mgr.apply_release("s", Release(finishes=(f"new{i}",)))
    check_structure(mgr)
