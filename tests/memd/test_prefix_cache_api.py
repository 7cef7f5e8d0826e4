"""memd's prefix cache over gRPC: MatchPrefix, Free/Alloc with cache ops, Capacity's evictable and
protected counts, FlushCache; bad input gets the right status and changes nothing. Every test ends
with both pools free (FlushCache, then run_memd's end check)."""

import contextlib
import json
import time

import grpc
import pytest

from client.__main__ import main as cli
from memd.attach import MemdSession
from protos import memd_pb2
from tests.daemons import memd_args, run_memd
from tests.models import tiny_draft, tiny_target

NF, IA, RE, FP = (
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.FAILED_PRECONDITION,
)
WINDOW = 128  # the bounded draft pool's window (ratio 0.25)
MODEL = "model-under-test"  # every session's model identity: they share one another's prefixes
DRAFTS = {
    "none": dict(draft=False, ratio=1.0, window=None),
    "identity": dict(draft=True, ratio=1.0, window=None),
    "bounded": dict(draft=True, ratio=0.25, window=WINDOW),
}


@contextlib.contextmanager
def memd_with(tmp_path, page: int, draft: str, max_running: int = 2, budget: int = 4_000_000):
    cfg = DRAFTS[draft]
    target = tiny_target(tmp_path / "t")
    draft_dir = tiny_draft(tmp_path / "d", window=WINDOW, block=4) if cfg["draft"] else None
    args = memd_args(
        draft=draft_dir,
        ratio=cfg["ratio"],
        window=cfg["window"],
        page=page,
        budget=budget,
        max_running=max_running,
        chunk=64,
    )
    with run_memd(target, *args, "--draft-eviction-interval", "0") as m:
        yield m
        cap = m.flush_and_wait_free()
        assert all(p.evictable == p.protected == 0 for _, p in sides(cap)), cap


@pytest.fixture(params=[1, 64], ids=["page1", "page64"])
def page(request):
    return request.param


def tokens(n: int, seed: int = 0) -> list[int]:
    return [(seed * 7919 + 31 * i) % 50_000 + 1 for i in range(n)]


def floor(n: int, page: int) -> int:
    return n // page * page


def session(m, client_name: str, **options) -> MemdSession:
    return MemdSession(m.address, client_name, model_fingerprint=MODEL, **options)


def sides(cap: memd_pb2.CapacityResponse):
    return [("target", cap.target)] + ([("draft", cap.draft)] if cap.has_draft else [])


def capacity(s: MemdSession) -> memd_pb2.CapacityResponse:
    """Capacity, after checking the accounting of every side: free + evictable + protected + held == total."""
    cap = s.stub.Capacity(memd_pb2.CapacityRequest(), timeout=5)
    for name, p in sides(cap):
        assert p.free + p.evictable + p.protected + p.held_by_requests == p.total, (name, p)
        assert p.used == p.total - p.free, (name, p)
        held = [h.target_held if name == "target" else h.draft_held for h in cap.session_holdings]
        assert p.held_by_requests == sum(held), (name, p)
    return cap


def counts(cap: memd_pb2.CapacityResponse) -> dict:
    return {name: (p.free, p.evictable, p.protected, p.held_by_requests) for name, p in sides(cap)}


def expect(code, call) -> str:
    with pytest.raises(grpc.RpcError) as err:
        call()
    assert err.value.code() == code, (err.value.code(), err.value.details())
    return err.value.details()


def wait_for(condition, timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def translate(s: MemdSession, target_slots) -> list[int]:
    return list(s.stub.Translate(memd_pb2.TranslateRequest(target_slots=list(target_slots)), timeout=5).draft_slots)


def run_and_cache(s: MemdSession, rid: str, ids: list[int]):
    """MatchPrefix, prefill the rest, finish into the cache. Returns the match and the request's
    target and draft slots of every position."""
    matched = s.match_prefix(rid, ids)
    target, draft = list(matched.target_slots), list(matched.draft_slots)
    if matched.cached_len < len(ids):
        new = s.alloc(extends=[(rid, matched.cached_len, len(ids) - matched.cached_len)]).requests[0]
        assert (new.rid, new.row, new.start) == (rid, matched.row, matched.cached_len)
        target += list(new.target_slots)
        draft += list(new.draft_slots)
    s.free(finishes=[rid], cache=[(rid, ids)])
    return matched, target, draft


@pytest.mark.parametrize("draft", ["none", "identity", "bounded"])
def test_match_insert_match_and_capacity(tmp_path, page, draft):
    n = 100  # fits the bounded pool's window: every position keeps its draft slot
    ids = tokens(n)
    cached = floor(n, page)
    with memd_with(tmp_path, page, draft) as m, session(m, "prefix") as s:
        pools = s.map()
        idle = capacity(s)
        first = s.match_prefix("a", ids)
        assert (first.rid, first.cached_len, list(first.target_slots), list(first.draft_slots)) == ("a", 0, [], [])
        assert 1 <= first.row <= 2
        cap = capacity(s)
        assert cap.running_requests == 1 and counts(cap) == counts(idle)  # a row, no slots yet
        a = s.alloc(extends=[("a", 0, n)]).requests[0]
        assert (a.row, a.start, len(a.target_slots)) == (first.row, 0, n)
        s.free(finishes=["a"], cache=[("a", ids)])

        cap = capacity(s)
        assert cap.running_requests == 0
        assert (cap.target.evictable, cap.target.protected, cap.target.held_by_requests) == (cached, 0, 0)
        assert cap.target.free == cap.target.total - cached
        if draft == "bounded":  # the whole prompt lay in the window: every cached position keeps draft KV
            assert (cap.draft.evictable, cap.draft.protected, cap.draft.free) == (cached, 0, cap.draft.total - cached)
        assert not pools["req_to_token"][first.row].any()

        hit = s.match_prefix("b", ids)
        assert hit.cached_len == cached and len(hit.target_slots) == len(hit.draft_slots) == cached
        assert list(hit.target_slots) == list(a.target_slots[:cached])
        if draft == "none":
            assert not any(hit.draft_slots)
        else:
            assert all(hit.draft_slots) and list(hit.draft_slots) == list(a.draft_slots[:cached])
            assert translate(s, hit.target_slots) == list(hit.draft_slots)
        assert pools["req_to_token"][hit.row, :cached].tolist() == list(hit.target_slots)
        assert not pools["req_to_token"][hit.row, cached:].any()
        cap = capacity(s)
        assert cap.running_requests == 1
        assert (cap.target.evictable, cap.target.protected, cap.target.held_by_requests) == (0, cached, 0)
        if draft == "bounded":
            assert (cap.draft.evictable, cap.draft.protected) == (0, cached)

        # Continue the matched request after its cached prefix; the new positions are its own.
        more = s.alloc(extends=[("b", cached, n - cached + 5)]).requests[0]
        assert (more.row, more.start) == (hit.row, cached)
        assert pools["req_to_token"][hit.row, : n + 5].tolist() == list(hit.target_slots) + list(more.target_slots)
        cap = capacity(s)
        own = -(-(n + 5) // page) * page - cached
        assert (cap.target.protected, cap.target.held_by_requests) == (cached, own)

        # FlushCache refuses while a request is held, and changes nothing.
        before = counts(capacity(s))
        expect(FP, s.flush_cache)
        assert counts(capacity(s)) == before
        s.free(finishes=["b"])  # no cache op: its own positions go back, the cached prefix stays
        cap = capacity(s)
        assert (cap.target.evictable, cap.target.protected, cap.target.held_by_requests) == (cached, 0, 0)

        flushed = s.flush_cache()
        assert flushed.target_freed == cached
        if draft == "bounded":
            assert flushed.draft_freed == cached
        cap = capacity(s)
        for name, p in sides(cap):
            assert (p.free, p.evictable, p.protected, p.held_by_requests) == (p.total, 0, 0, 0), name
        empty = s.flush_cache()  # nothing left to flush
        assert (empty.target_freed, empty.draft_freed) == (0, 0)


def test_a_shared_prefix_is_protected_once_and_a_diverging_prompt_matches_up_to_the_fork(tmp_path, page):
    n = 200
    ids = tokens(n)
    with memd_with(tmp_path, page, "identity", max_running=4) as m, session(m, "one") as s, session(m, "two") as other:
        _, target, _ = run_and_cache(s, "a", ids)
        cached = floor(n, page)
        # Another session shares the prefix; two requests on one prefix lock it once.
        x = other.match_prefix("x", ids)
        y = s.match_prefix("y", ids)
        assert x.cached_len == y.cached_len == cached
        assert list(x.target_slots) == list(y.target_slots) == target[:cached]
        assert x.row != y.row
        cap = capacity(s)
        assert (cap.target.evictable, cap.target.protected, cap.target.held_by_requests) == (0, cached, 0)
        # A prompt that leaves the cached one at position 130 matches the whole pages before it.
        fork = 130
        other_ids = ids[:fork] + tokens(n - fork, seed=5)
        z = other.match_prefix("z", other_ids)
        assert z.cached_len == floor(fork, page) and list(z.target_slots) == target[: z.cached_len]
        # The lease ends: the session's matched requests go, the cache stays.
        other.close()
        wait_for(lambda: capacity(s).running_requests == 1)
        cap = capacity(s)
        assert (cap.target.evictable, cap.target.protected, cap.target.held_by_requests) == (0, cached, 0)
        s.free(finishes=["y"])
        cap = capacity(s)
        assert (cap.target.evictable, cap.target.protected, cap.target.held_by_requests) == (cached, 0, 0)


def test_bounded_draft_pool_caches_the_window_only(tmp_path, page):
    """A prompt longer than the draft window: the cache keeps draft KV for the last window only, and a
    match of the whole prompt is still usable: its draft slots cover the window before cached_len."""
    n = 3 * WINDOW + 40
    ids = tokens(n)
    cached = floor(n, page)
    frontier = floor(n - WINDOW, page)  # first position with draft KV after the last trim
    with memd_with(tmp_path, page, "bounded") as m, session(m, "long") as s:
        assert s.match_prefix("a", ids).cached_len == 0
        draft = []
        for start in range(0, n, 64):  # prefill in chunks, trimming out-of-window draft KV as modeld does
            draft += s.alloc(extends=[("a", start, min(64, n - start))], trims=["a"]).requests[0].draft_slots
        s.free(trims=["a"])
        s.free(finishes=["a"], cache=[("a", ids)])
        cap = capacity(s)
        assert (cap.target.evictable, cap.draft.evictable) == (cached, cached - frontier)
        hit = s.match_prefix("b", ids)
        assert hit.cached_len == cached
        assert list(hit.draft_slots) == [0] * frontier + draft[frontier:cached]
        assert translate(s, hit.target_slots) == list(hit.draft_slots)
        cap = capacity(s)
        assert (cap.draft.evictable, cap.draft.protected) == (0, cached - frontier)
        # A shorter prompt on the same path: the window before its end reaches where the draft KV is
        # gone, and so does every shorter prefix's: nothing is usable for a speculating client (it
        # prefills again, which rebuilds the draft window) ...
        short = frontier + WINDOW // 2
        assert s.match_prefix("c", ids[:short]).cached_len == 0
        s.free(finishes=["c"])
        # ... while a client that writes no draft KV reuses the target KV.
        with session(m, "plain", writes_draft_kv=False) as plain:
            part = plain.match_prefix("d", ids[:short])
            assert part.cached_len == floor(short, page) and not any(part.draft_slots)
            assert list(part.target_slots) == list(hit.target_slots[: part.cached_len])
        s.free(finishes=["b"])


@pytest.mark.parametrize("draft", ["identity", "bounded"])
def test_a_client_that_writes_no_draft_kv_caches_no_draft_kv(tmp_path, page, draft):
    n = 100  # fits the window
    ids = tokens(n)
    with (
        memd_with(tmp_path, page, draft) as m,
        session(m, "plain", writes_draft_kv=False) as s,
        session(m, "spec") as spec,
    ):
        run_and_cache(s, "a", ids)
        cap = capacity(s)
        if draft == "identity":  # draft slot == target slot: the draft KV at the cached slots was never written
            assert cap.target.evictable == 0
        else:
            assert cap.target.evictable == floor(n, page)
            assert (cap.draft.evictable, cap.draft.protected, cap.draft.free) == (0, 0, cap.draft.total)
            mine = s.match_prefix("b", ids)  # a client that needs no draft KV reuses the target KV
            assert mine.cached_len == floor(n, page) and not any(mine.draft_slots)
            # A speculating client needs draft KV over the window before cached_len: none is usable here.
            assert spec.match_prefix("x", ids).cached_len == 0
            spec.free(finishes=["x"])
            s.free(finishes=["b"])
        # What the speculating client caches carries its draft KV, for both.
        run_and_cache(spec, "y", ids)
        hit = s.match_prefix("c", ids)
        assert hit.cached_len == floor(n, page)
        assert spec.match_prefix("z", ids).cached_len == floor(n, page)
        assert capacity(s).draft.protected == floor(n, page)
        spec.free(finishes=["z"])
        s.free(finishes=["c"])


def test_allocation_evicts_cached_prefixes_but_never_protected_ones(tmp_path, page):
    with memd_with(tmp_path, page, "none", max_running=3, budget=400_000) as m, session(m, "evict") as s:
        total = capacity(s).target.total
        one, two = tokens(200, seed=1), tokens(200, seed=2)
        run_and_cache(s, "one", one)
        run_and_cache(s, "two", two)
        cached = 2 * floor(200, page)
        cap = capacity(s)
        assert cap.target.evictable == cached and cap.target.free == total - cached
        # "one" is protected by a running request; the new request needs more than is free: "two" goes.
        held = s.match_prefix("held", one)
        need = cap.target.free + floor(200, page) // 2
        s.alloc(extends=[("big", 0, need)])
        cap = capacity(s)
        own = -(-need // page) * page
        assert (cap.target.protected, cap.target.evictable, cap.target.held_by_requests) == (floor(200, page), 0, own)
        assert s.match_prefix("again", two).cached_len == 0
        # Nothing left to evict: what only the protected prefix could give is refused, and nothing changes.
        before = counts(cap)
        expect(RE, lambda: s.alloc(grows=[("big", cap.target.free + page)]))
        assert counts(capacity(s)) == before
        assert held.cached_len == floor(200, page)
        s.free(finishes=["held", "big", "again"])


@pytest.mark.parametrize("draft", ["none", "bounded"])
def test_match_grants_the_first_chunk_in_the_same_call(tmp_path, page, draft):
    n = 100
    ids = tokens(n)
    with memd_with(tmp_path, page, draft) as m, session(m, "one-trip") as s:
        pools = s.map()
        _, cached_target, cached_draft = run_and_cache(s, "cached", ids)
        cached = floor(n, page)
        hit = s.match_prefix("b", ids + [5, 6, 7], extend_to=n + 3 + 8)  # the rest of the prompt and 8 ahead
        assert hit.cached_len == cached and hit.HasField("extension")
        ext = hit.extension
        assert (ext.rid, ext.row, ext.start, len(ext.target_slots)) == ("b", hit.row, cached, n + 11 - cached)
        slots = list(hit.target_slots) + list(ext.target_slots)
        assert slots[:cached] == cached_target[:cached] and len(set(slots)) == n + 11
        assert pools["req_to_token"][hit.row][: n + 11].tolist() == slots
        if draft == "bounded":
            assert all(ext.draft_slots) and translate(s, ext.target_slots) == list(ext.draft_slots)
        assert capacity(s).target.held_by_requests == -(-(n + 11) // page) * page - cached
        grown = s.alloc(grows=[("b", 4)]).requests[0]  # it goes on from extend_to
        assert (grown.start, len(grown.target_slots)) == (n + 11, 4)
        assert not s.match_prefix("c", ids, extend_to=5).HasField("extension")  # at or below the match: none asked
        s.free(finishes=["b", "c"])


def test_a_match_whose_first_chunk_has_no_room_stands_alone(tmp_path, page):
    with memd_with(tmp_path, page, "none", max_running=3, budget=400_000) as m, session(m, "no-room") as s:
        total = capacity(s).target.total
        s.alloc(extends=[("big", 0, total - page)])
        before = counts(capacity(s))
        alone = s.match_prefix("late", tokens(50), extend_to=3 * page)
        assert alone.cached_len == 0 and not alone.HasField("extension")
        cap = capacity(s)
        assert counts(cap) == before and cap.running_requests == 2  # the match holds a row, nothing else changed
        s.free(finishes=["big"])
        assert s.alloc(extends=[("late", 0, 3 * page)]).requests[0].start == 0  # admitted later, from its match
        s.free(finishes=["late"])


def test_a_batch_of_matches_is_each_match_in_order_and_ends_where_rows_run_out(tmp_path, page):
    """MatchPrefixBatch: each item as its own MatchPrefix, in order, in one call (the cached prefix for a prompt
    that has one); the first item without a free request row ends the batch and nothing changes for it or the rest;
    a bad item refuses the whole call before anything changed."""
    ids = tokens(100)
    with memd_with(tmp_path, page, "bounded", max_running=3) as m, session(m, "burst") as s:
        pools = s.map()
        _, cached_target, _ = run_and_cache(s, "cached", ids)
        cached = floor(100, page)
        before = counts(capacity(s))
        for bad in (
            [("x", ids), ("x", tokens(9))],
            [("x", ids), ("", ids)],
            [("x", ids), ("y", [1, -2])],
            [("x", ids), ("y", tokens(10**5))],
        ):
            expect(IA, lambda: s.match_prefix_batch(bad))
            assert counts(capacity(s)) == before and capacity(s).running_requests == 0
        expect(
            NF,
            lambda: s.stub.MatchPrefixBatch(
                memd_pb2.MatchPrefixBatchRequest(session_id="nope", items=[memd_pb2.MatchItem(rid="x", token_ids=ids)]),
                timeout=5,
            ),
        )
        expect(IA, lambda: s.match_prefix_batch([(f"r{i}", ids) for i in range(4)]))  # more items than rows exist
        s.match_prefix("early", tokens(5, seed=9))  # one of the three rows
        got = s.match_prefix_batch([("hit", ids + [4, 5]), ("miss", tokens(40, seed=3)), ("third", ids)])
        assert [g.rid for g in got] == ["hit", "miss"]  # two rows were left: the third item ends the batch
        assert [g.cached_len for g in got] == [cached, 0]
        assert list(got[0].target_slots) == cached_target[:cached]
        assert pools["req_to_token"][got[0].row][:cached].tolist() == cached_target[:cached]
        assert len({g.row for g in got}) == 2 and capacity(s).running_requests == 3
        s.free(finishes=["miss"])
        expect(IA, lambda: s.match_prefix_batch([("third", ids), ("hit", ids)]))  # "hit" is held: nothing matched
        assert capacity(s).running_requests == 2
        again = s.match_prefix_batch([("third", ids), ("fourth", tokens(7))])
        assert [g.rid for g in again] == ["third"] and again[0].cached_len == cached
        s.free(finishes=["early", "hit", "third"])
        assert capacity(s).running_requests == 0


def test_a_batch_grants_first_chunks_in_order_until_one_has_no_room(tmp_path, page):
    """MatchPrefixBatch with extend_to: each item's first chunk is granted with its match, in order; from the first
    item memd has no room for, no later item is granted one, not even one that would fit (FIFO for memory), and each
    is still matched. An extend_to outside the context refuses the whole call before anything changed."""
    with memd_with(tmp_path, page, "none", max_running=4, budget=400_000) as m, session(m, "burst-grants") as s:
        pools = s.map()
        total = capacity(s).target.total
        s.alloc(extends=[("big", 0, total - 4 * page)])  # four pages left
        before = counts(capacity(s))
        for bad in (-1, 10**6):
            expect(IA, lambda: s.match_prefix_batch([("x", tokens(5), 2 * page), ("y", tokens(5, seed=1), bad)]))
            assert counts(capacity(s)) == before and capacity(s).running_requests == 1
        got = s.match_prefix_batch(
            [("a", tokens(9), 2 * page), ("b", tokens(9, seed=1), 3 * page), ("c", tokens(9, seed=2), page)]
        )
        assert [g.rid for g in got] == ["a", "b", "c"] and [g.HasField("extension") for g in got] == [
            True,
            False,
            False,
        ]
        ext = got[0].extension
        assert (ext.rid, ext.row, ext.start, len(ext.target_slots)) == ("a", got[0].row, 0, 2 * page)
        assert pools["req_to_token"][ext.row][: 2 * page].tolist() == list(ext.target_slots)
        cap = capacity(s)
        assert cap.running_requests == 4 and cap.target.free == 2 * page  # b and c hold their rows, nothing more
        assert s.alloc(extends=[("c", 0, page)]).requests[0].start == 0  # admitted later, from its match
        s.free(finishes=["big", "a", "b", "c"])


def test_bad_input_gets_the_right_code_and_changes_nothing(tmp_path, page):
    ids = tokens(100)
    with memd_with(tmp_path, page, "bounded") as m, session(m, "bad") as s, session(m, "other") as other:
        pools = s.map()
        run_and_cache(s, "cached", ids)
        held = s.match_prefix("a", ids)
        a_ids = ids[: held.cached_len] + [7, 8, 9]
        s.alloc(extends=[("a", held.cached_len, 3)])
        other.match_prefix("theirs", ids)  # the second and last request row

        def snapshot():
            cap = capacity(s)
            return (counts(cap), cap.running_requests, pools["target_to_draft"].clone(), pools["req_to_token"].clone())

        before = snapshot()
        stub = s.stub
        cache_op = memd_pb2.CacheOp(rid="a", token_ids=a_ids)
        failing = [
            (
                NF,
                lambda: stub.MatchPrefix(
                    memd_pb2.MatchPrefixRequest(session_id="nope", rid="x", token_ids=ids), timeout=5
                ),
            ),
            (IA, lambda: s.match_prefix("", ids)),
            (IA, lambda: s.match_prefix("a", ids)),  # already held by this session
            (IA, lambda: s.match_prefix("neg", [1, 2, -3])),
            (IA, lambda: s.match_prefix("far", ids, extend_to=10**8)),  # beyond the context: not even matched
            (IA, lambda: s.match_prefix("back", ids, extend_to=-1)),
            (RE, lambda: s.match_prefix("c", ids)),  # no request row left
            # a running request's cache op (a checkpoint) whose tokens disagree with its matched prefix
            (IA, lambda: s.free(cache=[("a", [a_ids[0] + 1] + a_ids[1:])])),
            (NF, lambda: s.free(finishes=["a"], cache=[("a", a_ids), ("cached", ids)])),  # "cached" is not held
            (
                IA,
                lambda: s.alloc(cache=[("a", a_ids + [1, 2, 3])], grows=[("a", 1)]),
            ),  # checkpoint beyond its positions
            (IA, lambda: s.free(finishes=["a"], cache=[("a", a_ids + [1, 2, 3])])),  # more tokens than positions
            (NF, lambda: s.free(finishes=["ghost"], cache=[("ghost", ids)])),
            (NF, lambda: s.free(finishes=["theirs"], cache=[("theirs", ids)])),  # another session's request
            (NF, lambda: stub.Free(memd_pb2.FreeRequest(session_id="nope", finish=["a"], cache=[cache_op]), timeout=5)),
            # A valid finish + cache bundled with allocations that cannot be met (2 new requests, 1 row
            # free after the finish): nothing happens, not even the insert.
            (RE, lambda: s.alloc(finishes=["a"], cache=[("a", a_ids)], extends=[("e", 0, 1), ("f", 0, 1)])),
            (FP, s.flush_cache),
        ]
        for code, call in failing:
            expect(code, call)
            after = snapshot()
            assert after[:2] == before[:2] and all((x == y).all() for x, y in zip(after[2:], before[2:])), code
        # ... and the state is still usable.
        other.free(finishes=["theirs"])
        s.free(finishes=["a"], cache=[("a", a_ids)])
        cap = capacity(s)
        assert cap.running_requests == 0 and cap.target.evictable == floor(len(a_ids), page)


@pytest.mark.parametrize("draft", ["none", "bounded"])
def test_caching_a_matched_request_under_other_tokens_is_refused(tmp_path, page, draft):
    """The first cached_len positions of a matched request are the cache's pages: caching the request
    under other tokens would give them a second owner. INVALID_ARGUMENT, and memd (strict) lives on."""
    first, rest = tokens(64, seed=1), tokens(64, seed=3)
    with memd_with(tmp_path, page, draft) as m, session(m, "liar") as s:
        pools = s.map()
        run_and_cache(s, "r1", first)
        hit = s.match_prefix("r2", first + rest)
        assert hit.cached_len == 64
        s.alloc(extends=[("r2", 64, 64)])
        before = counts(capacity(s)), pools["req_to_token"].clone()
        expect(IA, lambda: s.free(finishes=["r2"], cache=[("r2", tokens(128, seed=9))]))
        after = counts(capacity(s)), pools["req_to_token"].clone()
        assert after[0] == before[0] and (after[1] == before[1]).all()
        s.free(finishes=["r2"], cache=[("r2", first + rest)])
        assert capacity(s).target.evictable == 128


def test_cli_flush_cache_and_capacity_against_memd(tmp_path, capsys):
    ids = tokens(10)
    with memd_with(tmp_path, 1, "none") as m, session(m, "cli") as s:
        run_and_cache(s, "a", ids)
        assert cli(["--memd", m.address, "capacity"]) == 0
        header, target, *_ = capsys.readouterr().out.splitlines()
        row = dict(zip(header.split(), target.split()))
        assert (row["evictable"], row["protected"], row["held"]) == ("10", "0", "0")
        s.match_prefix("b", ids)
        assert cli(["--memd", m.address, "flush-cache"]) == 1
        assert capsys.readouterr().err.startswith("error: FAILED_PRECONDITION: ")
        s.free(finishes=["b"])
        assert cli(["--memd", m.address, "flush-cache", "--json"]) == 0
        assert json.loads(capsys.readouterr().out) == {"target_freed": 10, "draft_freed": 0}
        assert cli(["--memd", m.address, "flush-cache"]) == 0
        assert capsys.readouterr().out.strip() == "flushed prefix cache: target_freed=0 draft_freed=0"
