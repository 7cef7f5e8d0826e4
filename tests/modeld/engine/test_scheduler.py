"""Unit tests of modeld's continuous-batching scheduler (modeld.engine.scheduler.Scheduler).

The scheduler talks to memd through a MemdSession. Here a fake session stands in for the
gRPC transport only: each alloc/free builds the protobuf messages that MemdSession would send,
and a real in-process memd.slots.SlotManager serves them. memd's errors come back as
grpc.RpcError carrying memd's status codes. After every call the allocator's structural
invariants are checked.

The scheduler runs inside the real engine (modeld.engine.loop.Engine: each step planned, run,
committed and emitted as modeld does it, releases flushed when idle, hopeless requests failed) over a fake runner in
place of the model: token n of every request's output is 1000 + n, and a DFLASH verify block accepts a chosen number of
drafts. The fake runner also keeps a fake KV cache: the token id written at every target slot the scheduler handed to a
step. So after each step we check more than memd's bookkeeping. Every computed position of every running request must be
backed, through memd's req_to_token, by the K/V of the right token. That is what makes preemption + recompute and
commit-after-verify observable without a model.
"""

import concurrent.futures
from dataclasses import dataclass, field

import grpc
import numpy as np
import pytest

from memd.errors import MemdError
from memd.invariants import check_structure
from memd.service import release_from_message, request_slots
from memd.slots import DraftMode, Release, SlotManager
from modeld.engine.loop import Engine
from modeld.engine.scheduler import Scheduler
from modeld.engine.step_items import StepItem
from modeld.request import Request
from modeld.runner.model_runner import ItemResult
from modeld.runner.steps_ahead import StepAhead
from modeld.sampling_params import SamplingParams
from modeld.spec.policy import REEXPLORE_MAX, BucketCosts, RunningMean, SpeculationPolicy
from protos import memd_pb2

P = 4  # page size of every pool in this file
SESSION = "modeld-under-test"


def out_token(n: int) -> int:
    """The simulated model's n-th output token (the same for every request)."""
    return 1000 + n


# ---- the fake memd session (transport double over a real SlotManager) ---------------------


class FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


@dataclass
class Call:
    """One memd call as it went over the wire (read back from the protobuf message)."""

    kind: str  # "alloc" | "free"
    extends: list[tuple[str, int, int]]
    grows: list[tuple[str, int]]
    commits: list[tuple[str, int]]
    trims: list[str]
    finishes: list[str]
    trim_lengths: dict[str, int | None] = field(default_factory=dict)  # rid -> the length its trim counts from
    error: str | None = None  # memd's status code name when the call was refused
    lengths: dict[str, int] = field(default_factory=dict)  # memd's request lengths after the call

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def allocated(self) -> set[str]:
        return {r for r, _, _ in self.extends} | {r for r, _ in self.grows}


def _release_msg(commits, trims, finishes, cache) -> memd_pb2.FreeRequest:
    return memd_pb2.FreeRequest(
        session_id=SESSION,
        commits=[memd_pb2.CommitOp(rid=r, length=n) for r, n in commits],
        trims=[memd_pb2.TrimOp(rid=t) if isinstance(t, str) else memd_pb2.TrimOp(rid=t[0], length=t[1]) for t in trims],
        finish=list(finishes),
        cache=[memd_pb2.CacheOp(rid=r, token_ids=list(ids)) for r, ids in cache],
    )


class FakeSession:
    """MemdSession.alloc / free with the same signatures, served by a real SlotManager."""

    def __init__(self, mgr: SlotManager):
        self.mgr = mgr
        mgr.open_session(SESSION, model="model-under-test")
        self.calls: list[Call] = []
        self.matches: list[Call] = []
        self.rounds: list[Call] = []  # every call that allocated or released, in order (`calls` + granting matches)

    def match_prefix(self, rid: str, token_ids, extend_to: int = 0, timeout: float = 10.0):
        call = Call("match", [], [], [], [], [])
        self.matches.append(call)  # kept apart: `calls` are the per-step Alloc / Free round trips
        matched = self._serve(call, self.mgr.match_prefix, SESSION, rid, list(token_ids), extend_to)
        if matched.extension is not None:  # it allocated: in the order of `rounds` (every call that allocates)
            call.extends = [(rid, matched.cached_len, extend_to - matched.cached_len)]
            self.rounds.append(call)
        return memd_pb2.MatchPrefixResponse(
            rid=rid,
            row=matched.row,
            cached_len=matched.cached_len,
            extension=None if matched.extension is None else request_slots(matched.extension),
        )

    def match_prefix_batch(self, items, timeout: float = 10.0):
        """MemdSession.match_prefix_batch: one "match-batch" call, its items the `extends` (rid, cached length,
        positions granted with the match) of those memd matched; one that granted any is in `rounds` too."""
        call = Call("match-batch", [], [], [], [], [])
        self.matches.append(call)
        matched = self._serve(
            call, self.mgr.match_prefix_batch, SESSION, [(rid, list(ids), end) for rid, ids, end in items]
        )
        call.extends = [
            (m.rid, m.cached_len, 0 if m.extension is None else len(m.extension.target_slots)) for m in matched
        ]
        if any(m.extension is not None for m in matched):
            self.rounds.append(call)
        return [
            memd_pb2.MatchPrefixResponse(
                rid=m.rid,
                row=m.row,
                cached_len=m.cached_len,
                extension=None if m.extension is None else request_slots(m.extension),
            )
            for m in matched
        ]

    def alloc(self, extends=(), grows=(), commits=(), trims=(), finishes=(), cache=(), timeout: float = 10.0):
        request = memd_pb2.AllocRequest(
            session_id=SESSION,
            release=_release_msg(commits, trims, finishes, cache),
            extends=[memd_pb2.ExtendOp(rid=r, prefix_len=p, num_tokens=n) for r, p, n in extends],
            grows=[memd_pb2.GrowOp(rid=r, num_tokens=n) for r, n in grows],
        )
        call = self._record("alloc", request.release, request)
        allocated = self._serve(
            call, self.mgr.step, request.session_id, release_from_message(request.release), call.extends, call.grows
        )
        return memd_pb2.AllocResponse(requests=[request_slots(a) for a in allocated])

    def alloc_async(self, grows=(), trims=(), finishes=(), cache=(), timeout: float = 10.0):
        """MemdSession.alloc_async: served at once here, recorded as a "sent ahead" call."""
        future = concurrent.futures.Future()
        try:
            future.set_result(self.alloc(grows=grows, trims=trims, finishes=finishes, cache=cache))
        except grpc.RpcError as exc:
            future.set_exception(exc)
        self.calls[-1].kind = "ahead"
        return future

    def free(self, commits=(), trims=(), finishes=(), cache=(), timeout: float = 10.0):
        request = _release_msg(commits, trims, finishes, cache)
        call = self._record("free", request, None)
        freed = self._serve(call, self.mgr.apply_release, request.session_id, release_from_message(request))
        return memd_pb2.FreeResponse(target_freed=freed[0], draft_freed=freed[1])

    def _record(self, kind: str, release: memd_pb2.FreeRequest, alloc: memd_pb2.AllocRequest | None) -> Call:
        call = Call(
            kind,
            extends=[(op.rid, op.prefix_len, op.num_tokens) for op in alloc.extends] if alloc else [],
            grows=[(op.rid, op.num_tokens) for op in alloc.grows] if alloc else [],
            commits=[(op.rid, op.length) for op in release.commits],
            trims=[op.rid for op in release.trims],
            finishes=list(release.finish),
            trim_lengths={op.rid: op.length if op.HasField("length") else None for op in release.trims},
        )
        self.calls.append(call)
        self.rounds.append(call)
        return call

    def _serve(self, call: Call, op, *args):
        try:
            result = op(*args)
        except MemdError as exc:
            call.error = exc.code
            raise FakeRpcError(getattr(grpc.StatusCode, exc.code), str(exc)) from exc
        finally:
            check_structure(self.mgr)  # a refused call changes nothing, a served one keeps every promise
        call.lengths = {r.rid: r.length for r in self.mgr.requests()}
        return result

    # views used by the tests
    def ok(self, kind: str = "alloc") -> list[Call]:
        return [c for c in self.calls if c.kind == kind and c.ok]

    def errors(self) -> list[str]:
        return [c.error for c in self.calls if not c.ok]


# ---- the simulated engine ---------------------------------------------------------------------


class FakeRunner:
    """The engine's runner without a model (modeld.runner.model_runner.ModelRunner.run): it checks each item's slots
    against memd's tables, writes the item's token ids into the simulation's KV, and returns what a model would
    commit. Nothing runs ahead of the host here (no pending step)."""

    def __init__(self, sim: "Sim"):
        self.sim = sim
        self.ahead = StepAhead(enabled=False)

    def run(self, items: list[StepItem], may_queue_next) -> list[ItemResult]:
        self.sim.items = items
        return [ItemResult(item, [self.sim.run_item(item)]) for item in items]


class Sim:
    """The real engine's step (modeld.engine.loop.Engine._step) over the scheduler, memd's allocator behind a fake
    transport, and a fake runner."""

    def __init__(
        self,
        *,
        pages: int,
        max_running: int = 8,
        chunk: int = 64,
        context: int = 64,
        block: int = 0,
        draft_pages: int = 0,
        window: int = 0,
        trim_gap: int = 0,
        max_requests: int = 8,
        accept=None,
        lookahead: int = 0,
        async_top_ups: bool = False,
        alone_prompt_tokens: int = 0,
        session: type = FakeSession,
    ):
        mode = DraftMode.BOUNDED if block else DraftMode.NONE
        self.mgr = SlotManager(
            target_pages=pages,
            draft_pages=draft_pages,
            page_size=P,
            mode=mode,
            window=window,
            trim_gap=trim_gap,
            max_requests=max_requests,
            context_len=context,
            mapping=np.zeros((pages + 1) * P, np.int32) if block else None,
            req_to_token=np.zeros((max_requests + 1, context), np.int32),
        )
        self.session = session(self.mgr)
        self.sched = Scheduler(
            self.session,
            max_running,
            chunk,
            context,
            block,
            lookahead=lookahead,
            async_top_ups=async_top_ups,
            alone_prompt_tokens=alone_prompt_tokens,
        )
        self.engine = Engine(
            FakeRunner(self),
            self.sched,
            tokenizer=None,  # no request here has stop strings: the engine thread detokenizes nothing
            eos_ids=set(),
            context_len=context,
            link=None,
            spec_block=block,
            trim_draft=bool(block),  # a bounded draft pool: out-of-window draft slots trimmed every step
        )
        self.context = context
        self.block = block
        self.accept = accept or (lambda req: block - 1)  # drafts accepted by a verify of `req`
        self.kv = np.full((pages + 1) * P, -1, np.int64)  # token whose K/V sits at each target slot
        self.done: dict[str, Request] = {}
        self.failed: dict[str, Request] = {}
        self.items: list[StepItem] = []  # the items of the last step
        self.verified: list[tuple[Request, int, int]] = []  # (request, L before, accepted) of the last step
        self.starts: dict[str, int] = {}  # computed before the last step, per item
        self._serial = 0

    # -- requests
    def request(self, rid: str, prompt_len: int, max_new: int, temperature: float = 0.0) -> Request:
        self._serial += 1
        prompt = [10_000 * self._serial + i for i in range(prompt_len)]  # distinct tokens per request
        req = Request(
            rid=rid, prompt_ids=prompt, params=SamplingParams(max_new_tokens=max_new, temperature=temperature)
        )
        self.engine.requests[rid] = req  # what the engine's inbox does with a submitted request
        self.sched.add(req)
        return req

    # -- one engine step
    def step(self) -> tuple[list[StepItem], list[Request]]:
        """One engine pass: the items it ran and the requests it failed as hopeless."""
        self.items, self.verified, self.starts = [], [], {}
        self.engine._step()
        hopeless = []
        for req in self.engine.delivered:  # requests given events in this pass: those that ended
            if req.finish is None or req.rid in self.done or req.rid in self.failed:
                continue
            if req.finish.reason == "abort":
                self.failed[req.rid] = req
                hopeless.append(req)
            else:
                self.done[req.rid] = req
        self.engine.delivered = []
        self.check()
        return self.items, hopeless

    def run_item(self, item: StepItem) -> list[int]:
        """What the model would commit for one item; its K/V written into the simulation's cache."""
        req, n, start = item.req, item.num_tokens, item.req.computed
        self.starts[req.rid] = start
        held = self._held()[req.rid]
        assert item.row == held.row and len(item.slots) == n
        assert item.slots == self.mgr.req_to_token[item.row, start : start + n].tolist(), "slots are not positions L.."
        if item.verify:
            assert self.block and n == self.block and req.pending == 1
            k = min(self.accept(req), n - 1)
            base = len(req.output_ids)
            drafts = [out_token(base + i) for i in range(k)] + [-7] * (n - 1 - k)  # rejected drafts are wrong
            item.tokens = [req.all_ids[start]] + drafts
            self.kv[item.slots] = item.tokens
            self.verified.append((req, start, k))
            return [out_token(base + i) for i in range(k + 1)]  # accepted drafts and the bonus token
        assert 1 <= n <= req.pending
        self.kv[item.slots] = req.all_ids[start : start + n]
        return [out_token(len(req.output_ids))] if n == req.pending else []

    # -- checks after every step
    def _held(self) -> dict:
        return {r.rid: r for r in self.mgr.requests()}

    def check(self) -> None:
        sched, held = self.sched, self._held()
        check_structure(self.mgr)
        assert len(sched.running) <= sched.max_running
        # memd holds exactly the running requests, the waiting ones matched at their cached prefix,
        # and those whose release is still to be sent
        matched = {r.rid for r in sched.waiting if r.in_memd}
        assert set(held) == {r.rid for r in sched.running} | matched | set(sched.memd.releases)
        assert len(set(sched.memd.releases)) == len(sched.memd.releases)
        for req in sched.running:
            assert req.in_memd and req.pending >= 1
            mem = held[req.rid]
            assert mem.length >= req.computed
            if req.rid in sched.memd.commits:
                assert sched.memd.commits[req.rid] == req.computed
            slots = self.mgr.req_to_token[mem.row, : req.computed]
            assert self.kv[slots].tolist() == req.all_ids[: req.computed], f"{req.rid}: KV does not match its tokens"
        for req in sched.waiting:  # matched (in memd at its cached prefix, perhaps with its first chunk granted) or not
            if req.in_memd:
                mem = held[req.rid]
                assert req.computed == mem.cached_pages * P and req.held == mem.length >= req.computed
            else:
                assert req.computed == req.held == 0
        if not sched.running and not sched.waiting and not sched.memd.releases:
            self.assert_all_free()

    def assert_all_free(self) -> None:
        """Idle: nothing held by requests; every page free or in the prefix cache, evictable."""
        assert not list(self.mgr.requests())
        evictable_t, protected_t, evictable_d, protected_d = self.mgr.cache_counts()
        assert protected_t == protected_d == 0
        assert self.mgr.target.free_tokens + evictable_t == self.mgr.target.total_tokens
        if self.mgr.draft is not None:
            assert self.mgr.draft.free_tokens + evictable_d == self.mgr.draft.total_tokens
        assert len(self.mgr.free_rows) == self.mgr.max_requests

    def idle(self) -> bool:
        return not self.sched.running and not self.sched.waiting

    def run(self, max_steps: int = 500, each=None) -> int:
        """Steps until nothing runs or waits (releases sent, and memd's answer applied: an idle pass sends them
        ahead, the next applies the answer); returns the number of steps."""
        for n in range(1, max_steps + 1):
            items, hopeless = self.step()
            if each:
                each(items, hopeless)
            if self.idle() and not self.sched.memd.releases and self.sched.memd.in_flight is None:
                return n
        raise AssertionError(
            f"not idle after {max_steps} steps: running {[r.rid for r in self.sched.running]}, "
            f"waiting {[r.rid for r in self.sched.waiting]}"
        )


def expected_outputs(max_new: int) -> list[int]:
    return [out_token(i) for i in range(max_new)]


def admissions(calls: list[Call]) -> list[str]:
    """Rids in the order of their (served) first prefill chunk: in an Alloc, or granted with an arrival's match."""
    return [
        r
        for c in calls
        if c.kind in ("alloc", "match", "match-batch") and c.ok
        for r, p, n in c.extends
        if p == 0 and n > 0
    ]


# ---- 1. one memd call per step --------------------------------------------------------------


def test_mixed_step_is_one_alloc_and_idle_releases_are_one_free():
    sim = Sim(pages=64, max_running=4, chunk=64, context=64)
    a, b = sim.request("a", 5, max_new=3), sim.request("b", 6, max_new=10)
    sim.step()  # both arrivals matched and granted their prompts in one MatchPrefixBatch: no Alloc
    assert [c.kind for c in sim.session.matches] == ["match-batch"] and not sim.session.calls
    assert sim.session.matches[0].extends == [("a", 0, 5), ("b", 0, 6)]  # each whole prompt
    for _ in range(2):  # a gets its 3 tokens (prefill + 2 decodes) and finishes; b keeps running
        before = len(sim.session.calls)
        sim.step()
        assert len(sim.session.calls) == before + 1
    assert "a" in sim.done and sim.sched.running == [b] and sim.sched.memd.releases == ["a"]
    c = sim.request("c", 7, max_new=2)

    before = len(sim.session.calls)
    items, _ = sim.step()  # releases of a + decode of b; c's prefill was granted with its match
    assert len(sim.session.calls) == before + 1
    call = sim.session.calls[-1]
    assert call.kind == "alloc" and call.ok
    assert call.finishes == ["a"] and call.grows == [("b", 1)] and call.extends == []
    assert sim.session.matches[-1].extends == [("c", 0, 7)]  # a lone arrival: match and first chunk in one call
    assert [(i.req.rid, i.num_tokens) for i in items] == [("b", 1), ("c", 7)]

    while sim.sched.running:
        sim.step()
    pending = list(sim.sched.memd.releases)  # the last finished: nothing left to batch its release with
    assert pending == ["b"] and not sim.sched.waiting
    before = len(sim.session.calls)
    items, hopeless = sim.step()
    assert items == [] and hopeless == []
    assert len(sim.session.calls) == before + 1
    call = sim.session.calls[-1]
    assert call.kind == "free" and call.ok and call.finishes == pending and not sim.sched.memd.releases
    sim.assert_all_free()
    before = len(sim.session.calls)
    sim.step()  # idle with nothing to release: no memd call at all
    assert len(sim.session.calls) == before
    assert c.output_ids == expected_outputs(2) and a.output_ids == expected_outputs(3)


@pytest.mark.parametrize("lookahead", [0, 8])
def test_a_lone_arrival_is_admitted_in_one_round_trip(lookahead):
    sim = Sim(pages=64, max_running=4, chunk=64, context=64, lookahead=lookahead, async_top_ups=bool(lookahead))
    x = sim.request("x", 5, max_new=3)
    calls = len(sim.session.calls)
    items, _ = sim.step()
    assert len(sim.session.calls) == calls  # no Alloc: the match granted the prompt (and the lookahead)
    assert sim.session.matches[-1].extends == [("x", 0, 5 + lookahead)]
    assert [(i.req.rid, i.num_tokens) for i in items] == [("x", 5)] and x.held == 5 + lookahead
    sim.run()
    assert x.output_ids == expected_outputs(3)
    sim.assert_all_free()
    # (An arrival behind one admitted earlier in the same step is matched without a grant, so it never takes
    # memory ahead of it: test_preemption_releases_the_newest_and_recomputes_it_later re-admits c before d.)


def test_every_step_is_exactly_one_served_alloc_without_pressure():
    sim = Sim(pages=128, max_running=3, chunk=8, context=64)
    for i in range(6):
        sim.request(f"r{i}", 5 + 3 * i, max_new=4 + i)

    seen = [0]  # memd calls before the step

    def one_call(items, hopeless):
        if items:
            assert len(sim.session.calls) == seen[0] + 1 and sim.session.calls[-1].kind == "alloc"
        seen[0] = len(sim.session.calls)

    sim.run(each=one_call)
    assert not sim.session.errors()
    assert {rid: r.output_ids for rid, r in sim.done.items()} == {f"r{i}": expected_outputs(4 + i) for i in range(6)}


# ---- 2. chunked prefill under the token budget ------------------------------------------------


def test_long_prompt_is_prefilled_in_chunks_after_the_decodes():
    sim = Sim(pages=64, max_running=4, chunk=8, context=64)
    sim.request("a", 3, max_new=20)
    sim.request("b", 4, max_new=20)
    sim.step()  # a and b prefilled together (7 tokens <= 8)
    x = sim.request("x", 30, max_new=2)

    chunks = []
    while x.computed < len(x.prompt_ids):
        items, _ = sim.step()
        call = sim.session.calls[-1]
        assert call.grows == [("a", 1), ("b", 1)]  # every running decode, whatever the prefill budget
        assert [i.req.rid for i in items] == ["a", "b", "x"]  # decodes first, then the chunk
        assert all(i.num_tokens == 1 for i in items[:2])
        ((rid, prefix, n),) = call.extends
        assert rid == "x" and prefix == sum(chunks) and n <= 8
        chunks.append(n)
    assert chunks == [8, 8, 8, 6]
    assert len(x.output_ids) == 1  # the last chunk sampled the first token
    sim.run()
    assert x.output_ids == expected_outputs(2)


def test_a_lone_short_prompt_chunk_runs_alone_once_then_the_decodes_follow():
    """With alone_prompt_tokens (modeld on CUDA: a lone chunk then replays a graph of one request), a short arrival
    runs without the decodes; the step after it runs them, even when another short one arrives (never two such
    steps in a row); a longer chunk, or two arrivals, run beside the decodes as without it."""
    sim = Sim(pages=64, max_running=6, chunk=64, context=64, alone_prompt_tokens=8)
    sim.request("a", 3, max_new=20)
    sim.request("b", 4, max_new=20)
    sim.step()  # a and b admitted together: nothing decodes yet, so they run as usual
    sim.step()
    sim.request("x", 5, max_new=4)
    items, _ = sim.step()
    assert [(i.req.rid, i.num_tokens) for i in items] == [("x", 5)], "a lone short arrival ran beside the decodes"
    sim.request("y", 6, max_new=4)
    items, _ = sim.step()
    assert [(i.req.rid, i.num_tokens) for i in items] == [("a", 1), ("b", 1), ("x", 1), ("y", 6)]
    items, _ = sim.step()
    assert [i.req.rid for i in items] == ["a", "b", "x", "y"]
    sim.request("long", 9, max_new=2)  # longer than alone_prompt_tokens
    items, _ = sim.step()
    assert [(i.req.rid, i.num_tokens) for i in items][-1] == ("long", 9) and len(items) == 5
    sim.request("p", 2, max_new=2)
    sim.request("q", 2, max_new=2)  # two arrivals: one step beside the decodes
    items, _ = sim.step()
    assert {i.req.rid for i in items} >= {"a", "p", "q"}
    sim.run()
    for rid, n in (("a", 20), ("b", 20), ("x", 4), ("y", 4), ("long", 2), ("p", 2), ("q", 2)):
        assert sim.done[rid].output_ids == expected_outputs(n)


@pytest.mark.parametrize("block", [0, 4])
def test_lone_prompt_chunks_alone_under_pressure_keep_outputs_and_kv_right(block):
    """Arrivals one at a time into a tight pool with calls sent ahead (plain, and DFLASH with a bounded draft pool):
    lone chunks run alone, preempted requests come back as lone chunks too, and every request ends with its tokens."""
    sizes = dict(pages=8, draft_pages=8, window=8, trim_gap=1) if block else dict(pages=12)
    sim = Sim(
        **sizes,
        block=block,
        max_running=4,
        chunk=12,
        context=64,
        lookahead=6,
        async_top_ups=True,
        alone_prompt_tokens=8,
    )
    lengths = [(7, 12), (3, 20), (11, 6), (5, 15), (9, 9), (2, 25), (6, 3)]
    alone = 0
    for i, (prompt, max_new) in enumerate(lengths):
        sim.request(f"r{i}", prompt, max_new)
        for _ in range(3):  # the next arrival comes a few steps later
            items, _ = sim.step()
            alone += len(items) == 1 and not items[0].verify and items[0].num_tokens > 1 and len(sim.sched.running) > 1
    sim.run()
    assert alone, "no prompt chunk ran alone: the test proves nothing"
    assert sim.sched.preemptions > 0, "the pool was never short: the test proves nothing"
    assert not sim.failed
    assert {rid: r.output_ids for rid, r in sim.done.items()} == {
        f"r{i}": expected_outputs(m) for i, (_, m) in enumerate(lengths)
    }
    sim.assert_all_free()


def test_prefill_budget_is_shared_by_chunks_and_admissions_in_fifo_order():
    sim = Sim(pages=64, max_running=4, chunk=8, context=64)
    sim.request("x", 5, max_new=3)
    sim.request("y", 10, max_new=3)
    sim.request("z", 2, max_new=3)
    sim.step()  # all three matched in one batch; x's whole prompt fits the budget: granted with its match
    assert sim.session.matches[-1].extends == [("x", 0, 5), ("y", 0, 0), ("z", 0, 0)]
    assert sim.session.calls[-1].extends == [("y", 0, 3)]  # y's first chunk, after x; budget spent: z waits, matched
    assert [r.rid for r in sim.sched.waiting] == ["z"] and sim.sched.waiting[0].in_memd
    sim.step()
    call = sim.session.calls[-1]
    assert call.grows == [("x", 1)] and call.extends == [("y", 3, 7), ("z", 0, 1)]
    sim.step()  # z's last prompt token is computed like a decode (pending == 1): a grow
    call = sim.session.calls[-1]
    assert call.extends == [] and call.grows == [("x", 1), ("y", 1), ("z", 1)]
    sim.run()
    assert all(r.output_ids == expected_outputs(3) for r in sim.done.values()) and len(sim.done) == 3


# ---- 3. max_running ---------------------------------------------------------------------------


def test_max_running_caps_the_batch_and_the_rest_wait_in_fifo_order():
    sim = Sim(pages=128, max_running=2, chunk=64, context=64)
    rids = [f"r{i}" for i in range(6)]
    for i, rid in enumerate(rids):
        sim.request(rid, 4, max_new=2 + (i % 3))

    def capped(items, hopeless):
        assert len(sim.sched.running) <= 2
        assert len({i.req.rid for i in items}) <= 2
        waiting = [r.rid for r in sim.sched.waiting]
        assert waiting == rids[len(rids) - len(waiting) :]  # a suffix of the arrival order

    sim.run(each=capped)
    assert admissions(sim.session.rounds) == rids
    assert sim.sched.preemptions == 0 and not sim.session.errors()
    assert all(sim.done[rid].output_ids == expected_outputs(2 + i % 3) for i, rid in enumerate(rids))


# ---- 4. memory pressure: admissions wait --------------------------------------------------------


def test_request_that_does_not_fit_waits_while_running_requests_decode():
    sim = Sim(pages=8, max_running=4, chunk=64, context=64)  # 32 tokens
    a, b = sim.request("a", 9, max_new=5), sim.request("b", 9, max_new=5)  # 3 pages, then 4 (13 tokens) each
    sim.step()
    c = sim.request("c", 12, max_new=2)  # 3 pages: only 2 are free

    for _ in range(3):
        n_calls = len(sim.session.calls)
        items, _ = sim.step()
        new = sim.session.calls[n_calls:]
        assert [call.error for call in new] == ["RESOURCE_EXHAUSTED", None]  # with c, then without it
        assert new[0].extends == [("c", 0, 12)] and new[1].extends == [] and new[1].grows == [("a", 1), ("b", 1)]
        assert [i.req.rid for i in items] == ["a", "b"]
        assert list(sim.sched.waiting) == [c] and sim.sched.running == [a, b]
        assert sim.sched.preemptions == 0 and all(not call.finishes for call in new)
    sim.step()  # a and b sample their 5th token and finish; c still does not fit
    assert sim.session.calls[-2].error == "RESOURCE_EXHAUSTED" and list(sim.sched.waiting) == [c]
    assert a.rid in sim.done and b.rid in sim.done
    sim.step()  # the releases of a and b make room for c, in the same call
    call = sim.session.calls[-1]
    assert call.ok and sorted(call.finishes) == ["a", "b"] and call.extends == [("c", 0, 12)]
    sim.run()
    assert sim.sched.preemptions == 0
    assert [sim.done[r].output_ids for r in "abc"] == [expected_outputs(5), expected_outputs(5), expected_outputs(2)]


def test_running_prefill_continues_while_an_admission_waits():
    """Level 1: the new request is dropped from the plan, the running one's chunk is not."""
    sim = Sim(pages=7, max_running=4, chunk=16, context=64)  # 28 tokens
    x = sim.request("x", 24, max_new=2)
    sim.step()  # x: 16 of 24 prompt tokens (4 pages)
    y = sim.request("y", 20, max_new=2)
    n_calls = len(sim.session.calls)
    items, hopeless = sim.step()
    new = sim.session.calls[n_calls:]
    assert [c.error for c in new] == ["RESOURCE_EXHAUSTED", None]
    assert new[0].extends == [("x", 16, 8), ("y", 0, 8)] and new[1].extends == [("x", 16, 8)]
    assert [(i.req.rid, i.num_tokens) for i in items] == [("x", 8)] and not hopeless
    assert x.computed == 24 and list(sim.sched.waiting) == [y] and sim.sched.preemptions == 0
    sim.run()
    assert not sim.failed and sim.sched.preemptions == 0
    assert x.output_ids == y.output_ids == expected_outputs(2)


# ---- 5. preemption ------------------------------------------------------------------------------


def test_preemption_releases_the_newest_and_recomputes_it_later():
    sim = Sim(pages=10, max_running=3, chunk=32, context=64)  # 40 tokens; three requests grow to 15
    reqs = {rid: sim.request(rid, 6, max_new=10) for rid in "abcd"}  # d waits for a free place
    c = reqs["c"]
    snapshot = {}  # the state right after the preempting step

    def watch(items, hopeless):
        if sim.sched.preemptions and not snapshot:
            snapshot.update(
                waiting=[r.rid for r in sim.sched.waiting],
                computed=c.computed,
                outputs=list(c.output_ids),
                in_memd=c.in_memd,
                held=set(sim._held()),
            )

    sim.run(each=watch)

    assert sim.sched.preemptions == 1
    # the preempting step: refusals at every level, then one call that releases c and serves a, b
    calls = sim.session.rounds
    i = next(k for k, call in enumerate(calls) if call.ok and "c" in call.finishes)
    served = calls[i]
    assert served.grows == [("a", 1), ("b", 1)] and served.extends == [] and served.finishes == ["c"]
    assert calls[i - 1].error == "RESOURCE_EXHAUSTED" and ("c", 1) in calls[i - 1].grows
    # c goes to the front of the queue with nothing computed and its tokens kept
    assert snapshot["waiting"] == ["c", "d"]
    assert snapshot["computed"] == 0 and not snapshot["in_memd"] and "c" not in snapshot["held"]
    assert snapshot["outputs"] == expected_outputs(len(snapshot["outputs"])) and snapshot["outputs"]
    # re-admitted later, before d: its prompt's full page from memd's prefix cache (the engine checkpointed the
    # computed prompt), the rest of the prompt and its outputs recomputed in one chunk
    readmit = next(k for k, call in enumerate(calls) if k > i and call.ok and any(r == "c" for r, _, _ in call.extends))
    assert readmit > i
    assert ("c", P, 6 + len(snapshot["outputs"]) - P) in calls[readmit].extends
    assert admissions(calls) == ["a", "b", "c", "d"]
    # every request ends with exactly its tokens, and the pool is empty
    assert {rid: r.output_ids for rid, r in sim.done.items()} == {rid: expected_outputs(10) for rid in "abcd"}
    assert not sim.failed and set(sim.session.errors()) == {"RESOURCE_EXHAUSTED"}
    sim.assert_all_free()


def test_many_requests_under_pressure_all_finish_with_their_tokens():
    """Mixed lengths through a tight pool: preemptions happen, the KV check holds every step."""
    sim = Sim(pages=12, max_running=5, chunk=12, context=64)  # 48 tokens
    lengths = [(7, 12), (3, 20), (11, 6), (5, 15), (9, 9), (2, 25), (6, 3)]
    for i, (prompt, max_new) in enumerate(lengths):
        sim.request(f"r{i}", prompt, max_new)
    sim.run()
    assert sim.sched.preemptions > 0, "the pool was never short: the test proves nothing"
    assert not sim.failed
    assert {rid: r.output_ids for rid, r in sim.done.items()} == {
        f"r{i}": expected_outputs(m) for i, (_, m) in enumerate(lengths)
    }
    assert set(sim.session.errors()) == {"RESOURCE_EXHAUSTED"}
    sim.assert_all_free()


def test_a_refused_plan_is_not_asked_again_in_the_same_step():
    """Shrinking levels that leave the plan unchanged do not cost another memd round trip."""
    sim = Sim(pages=12, max_running=5, chunk=12, context=64)
    for i, (prompt, max_new) in enumerate([(7, 12), (3, 20), (11, 6), (5, 15), (9, 9), (2, 25), (6, 3)]):
        sim.request(f"r{i}", prompt, max_new)
    seen = [0]

    def no_repeats(items, hopeless):
        step_calls = sim.session.calls[seen[0] :]
        seen[0] = len(sim.session.calls)
        refused = [
            (tuple(c.extends), tuple(c.grows), tuple(c.commits), tuple(c.trims), tuple(c.finishes))
            for c in step_calls
            if not c.ok
        ]
        assert len(refused) == len(set(refused)), f"memd was asked the same refused plan twice: {refused}"

    sim.run(each=no_repeats)
    assert sim.sched.preemptions > 0 and not sim.failed


# ---- 6. requests that can never fit -------------------------------------------------------------


def test_request_larger_than_the_pool_is_hopeless_and_others_are_unaffected():
    sim = Sim(pages=8, max_running=4, chunk=8, context=64)  # 32 tokens
    small = sim.request("small", 3, max_new=6)
    sim.step()
    big = sim.request("big", 40, max_new=2)
    hopeless_steps = []
    sim.run(each=lambda items, hopeless: hopeless_steps.extend(hopeless))

    assert hopeless_steps == [big] and sim.failed == {"big": big}
    assert big.finish.reason == "abort" and big.finish.error_code == "RESOURCE_EXHAUSTED"
    assert not big.in_memd and big not in sim.sched.running and big not in sim.sched.waiting
    assert "big" in [r for call in sim.session.calls if call.ok for r in call.finishes]  # its slots went back
    assert small.output_ids == expected_outputs(6) and "small" in sim.done
    sim.assert_all_free()


def test_request_larger_than_the_pool_fails_alone_after_filling_it():
    sim = Sim(pages=8, max_running=4, chunk=8, context=64)  # 32 tokens, chunks of 8
    big = sim.request("big", 40, max_new=2)
    for _ in range(4):
        items, hopeless = sim.step()
        assert [(i.req.rid, i.num_tokens) for i in items] == [("big", 8)] and not hopeless
    items, hopeless = sim.step()  # the 5th chunk cannot fit: the pool holds 32 tokens
    assert items == [] and hopeless == [big]
    assert big.finish.error_code == "RESOURCE_EXHAUSTED" and "40 tokens" in big.finish.error
    assert sim.session.calls[-1].kind == "free" and sim.session.calls[-1].finishes == ["big"]
    sim.assert_all_free()


def test_request_whose_first_chunk_exceeds_the_pool_is_hopeless_not_stuck():
    """BUG: a waiting request whose first chunk never fits is never failed.

    Pool 32 tokens, chunk 64, prompt 40: nothing runs, the admission is refused
    (RESOURCE_EXHAUSTED), level 1 plans nothing, and next_step returns ([], []) because
    `not self.running`. The request stays at the head of `waiting` forever (the engine retries
    every 0.5 s), and it blocks every request behind it (FIFO head of line)."""
    sim = Sim(pages=8, max_running=4, chunk=64, context=64)
    big = sim.request("big", 40, max_new=2)
    small = sim.request("small", 4, max_new=2)
    for _ in range(10):
        sim.step()
        if "big" in sim.failed:
            break
    assert "big" in sim.failed and big.finish.error_code == "RESOURCE_EXHAUSTED", (
        f"after 10 steps big is still waiting ({[r.rid for r in sim.sched.waiting]}); "
        f"memd refused {len(sim.session.errors())} admissions and nothing was failed"
    )
    sim.run()
    assert small.output_ids == expected_outputs(2)


# ---- 7. no re-admission in the releasing call ---------------------------------------------------


def _no_rid_released_and_allocated(calls: list[Call]) -> None:
    for call in calls:
        assert not (set(call.finishes) & call.allocated), f"finish + allocate of one rid in one call: {call}"
        assert call.error in (None, "RESOURCE_EXHAUSTED"), f"memd refused a call with {call.error}: {call}"


@pytest.mark.parametrize("pages", [6, 7, 9])
def test_preempted_request_is_not_readmitted_in_the_releasing_call(pages):
    # after the victim's release the pool has room for its recompute: a naive scheduler would
    # admit it again in the same call, which memd refuses with INVALID_ARGUMENT
    sim = Sim(pages=pages, max_running=3, chunk=64, context=64)
    for rid, prompt in (("a", 5), ("b", 4), ("v", 2)):
        sim.request(rid, prompt, max_new=14)
    sim.run()  # an INVALID_ARGUMENT would raise out of next_step
    assert sim.sched.preemptions > 0
    _no_rid_released_and_allocated(sim.session.calls)
    readmitted = admissions(sim.session.rounds)
    assert len(readmitted) > 3  # the victims did come back, in later calls
    assert all(r.output_ids == expected_outputs(14) for r in sim.done.values()) and len(sim.done) == 3
    sim.assert_all_free()


def test_resubmitted_rid_waits_for_the_release_of_its_predecessor():
    sim = Sim(pages=64, max_running=4, chunk=64, context=64)
    sim.request("keep", 4, max_new=8)
    sim.request("x", 4, max_new=1)
    sim.step()  # x finishes at once: its release is pending
    assert "x" in sim.done and sim.sched.memd.releases == ["x"]
    again = sim.request("x", 6, max_new=2)  # same rid, accepted again by the engine once completed
    sim.step()
    call = sim.session.calls[-1]
    assert call.ok and call.finishes == ["x"] and call.extends == [] and call.grows == [("keep", 1)]
    assert list(sim.sched.waiting) == [again]
    sim.step()
    assert sim.session.matches[-1].extends == [("x", 0, 6)]  # granted with its match
    sim.run()
    _no_rid_released_and_allocated(sim.session.calls)
    assert again.output_ids == expected_outputs(2)


# ---- 8. DFLASH: verify blocks, commit + trim, bounded draft pool -------------------------------


B = 4
ACCEPT_CYCLE = [3, 0, 2, 1, 3, 3, 0]


def dflash_sim(**kw) -> Sim:
    counter = {}

    def accept(req):
        n = counter.get(req.rid, 0)
        counter[req.rid] = n + 1
        return ACCEPT_CYCLE[n % len(ACCEPT_CYCLE)]

    args = dict(
        pages=40, draft_pages=12, window=8, trim_gap=4, block=B, max_running=2, chunk=16, context=96, accept=accept
    )
    args.update(kw)
    return Sim(**args)


def test_dflash_verify_blocks_commit_trim_and_plain_decodes_at_the_context_end():
    sim = dflash_sim()
    x = sim.request("x", 10, max_new=86)  # grows to the whole context (96)
    kinds = []
    last_verify = None  # (L, k) of the previous step's verify
    while "x" not in sim.done:
        calls_before = len(sim.session.calls)
        items, _ = sim.step()
        if not kinds:  # the prefill, granted with x's match: no Alloc
            assert len(sim.session.calls) == calls_before and sim.session.matches[-1].extends == [("x", 0, 10)]
            assert not items[0].verify
            kinds.append("prefill")
            continue
        call = sim.session.calls[-1]
        assert len(sim.session.calls) == calls_before + 1 and call.ok
        if last_verify is not None:
            L, k = last_verify
            assert call.commits == [("x", L + k + 1)] and call.trims == ["x"]
            n = call.grows[0][1] if call.grows else 0
            if "x" in call.lengths:
                assert call.lengths["x"] == L + k + 1 + n  # memd kept the committed length, then grew
        elif kinds:  # after a prefill chunk or a plain decode: a trim only, no commit
            assert call.commits == [] and call.trims == ["x"]
        (item,) = items
        if call.extends:
            kinds.append("prefill")
            assert not item.verify
        elif sim.starts["x"] + B <= sim.context:
            assert item.verify and item.num_tokens == B and call.grows == [("x", B)]
            kinds.append("verify")
        else:
            assert not item.verify and item.num_tokens == 1 and call.grows == [("x", 1)]
            kinds.append("plain")
        last_verify = (sim.verified[0][1], sim.verified[0][2]) if sim.verified else None
    assert kinds[0] == "prefill" and "verify" in kinds and kinds[-1] == "plain"
    assert kinds.index("plain") > len(kinds) - 4 and set(kinds[kinds.index("plain") :]) == {"plain"}
    assert x.output_ids == expected_outputs(86) and len(x.all_ids) == sim.context
    sim.run()
    sim.assert_all_free()


def test_dflash_commit_is_applied_before_the_next_growth():
    sim = dflash_sim(accept=lambda req: 1)
    x = sim.request("x", 10, max_new=20)
    sim.step()  # prefill: computed 10, one token sampled
    sim.step()  # verify [t, d1, d2, d3] at 10..13, one draft accepted
    assert sim.verified and sim.verified[0][1:] == (10, 1)
    assert x.computed == 12 and sim.sched.memd.commits == {"x": 12} and sim.sched.memd.trims == {"x": 12}
    assert sim._held()["x"].length == 14  # the rejected tail is still held until the next call
    sim.sched.memd.flush_releases()  # what the engine does when the batch is empty
    call = sim.session.calls[-1]
    assert call.kind == "free" and call.commits == [("x", 12)] and call.trims == ["x"] and call.finishes == []
    assert sim._held()["x"].length == 12 and not sim.sched.memd.commits and not sim.sched.memd.trims
    sim.step()
    assert sim.session.calls[-1].commits == [] and sim.session.calls[-1].grows == [("x", B)]
    assert sim._held()["x"].length == 12 + B


def test_dflash_remove_drops_pending_commit_and_trim():
    sim = dflash_sim()
    x = sim.request("x", 5, max_new=40)
    y = sim.request("y", 6, max_new=40)
    sim.step()
    sim.step()  # both verified: commits and trims pending for both
    memd = sim.sched.memd
    assert set(memd.commits) == {"x", "y"} and set(memd.trims) == {"x", "y"}
    sim.sched.remove(x)  # aborted
    assert set(memd.commits) == {"y"} and set(memd.trims) == {"y"} and memd.releases == ["x"]
    sim.step()
    call = sim.session.calls[-1]
    assert call.ok and call.finishes == ["x"]
    assert [r for r, _ in call.commits] == ["y"] and call.trims == ["y"] and call.grows == [("y", B)]
    sim.sched.remove(y)  # aborted right after a verify: the finish alone goes out
    sim.step()
    call = sim.session.calls[-1]
    assert call.kind == "free" and call.finishes == ["y"] and call.commits == [] and call.trims == []
    sim.assert_all_free()


def test_dflash_draft_side_stays_bounded_over_long_runs():
    # 3 requests of up to 128 tokens each (96 target pages at the end) through a draft pool of
    # 24 pages: only the trims of out-of-window draft slots make this run possible
    window, gap = 8, 4
    sim = dflash_sim(pages=100, draft_pages=24, window=window, trim_gap=gap, max_running=3, context=128, max_requests=4)
    for rid, prompt in (("a", 20), ("b", 7), ("c", 33)):
        sim.request(rid, prompt, max_new=128 - prompt)
    peak = {"draft": 0, "per_request": 0, "target": 0}

    def watch(items, hopeless):
        peak["draft"] = max(peak["draft"], sim.mgr.held_tokens()[1])
        peak["target"] = max(peak["target"], sim.mgr.held_tokens()[0])
        for r in sim.mgr.requests():
            peak["per_request"] = max(peak["per_request"], (len(r.target_pages) - r.draft_start // P) * P)

    sim.run(each=watch)
    # per request: the window, the trim gap, a verify block and page rounding (+ the largest prefill chunk)
    bound = window + gap + 16 + 2 * P
    assert peak["per_request"] <= bound
    assert peak["draft"] <= 3 * bound < peak["target"]
    assert not sim.failed and sim.sched.preemptions == 0
    assert {rid: len(r.all_ids) for rid, r in sim.done.items()} == {"a": 128, "b": 128, "c": 128}
    assert all(r.output_ids == expected_outputs(len(r.output_ids)) for r in sim.done.values())
    sim.assert_all_free()


@pytest.mark.parametrize("lookahead", [0, 6])
def test_dflash_preemption_under_pressure_keeps_kv_and_draft_consistent(lookahead):
    sim = dflash_sim(pages=14, draft_pages=14, window=8, trim_gap=1, max_running=3, context=64, lookahead=lookahead)
    for i, (prompt, max_new) in enumerate([(9, 30), (5, 24), (12, 18), (3, 33)]):
        sim.request(f"r{i}", prompt, max_new)
    sim.run()
    assert sim.sched.preemptions > 0
    assert not sim.failed
    _no_rid_released_and_allocated(sim.session.calls)
    assert {rid: r.output_ids for rid, r in sim.done.items()} == {
        f"r{i}": expected_outputs(m) for i, m in enumerate([30, 24, 18, 33])
    }
    sim.assert_all_free()


def test_dflash_request_that_fits_with_plain_decodes_is_not_failed():
    """BUG: with DFLASH a lone request is failed as hopeless when its verify block of B tokens
    does not fit, even though a plain 1-token decode (which the scheduler already uses at the
    end of the context) would fit. Pool 16 tokens, prompt 6, max_new 10: all_ids reaches 16
    and the last sampled token is never computed, so plain decoding never holds more than 15
    positions. But at computed 13 (no draft accepted) the verify asks memd for 13 + 4 = 17,
    and the request fails with "needs 14 tokens of KV and the pool cannot hold them"."""
    sim = dflash_sim(pages=4, draft_pages=4, window=8, trim_gap=1, accept=lambda req: 0, max_running=1)
    x = sim.request("x", 6, max_new=10)
    sim.run(max_steps=50)
    assert not sim.failed, f"failed: {x.finish}"
    assert x.output_ids == expected_outputs(10)


# ---- 9. decode slots granted ahead (lookahead): most steps make no memd call ------------------


def test_lookahead_decodes_skip_memd_and_outputs_and_kv_stay_right():
    sim = Sim(pages=128, max_running=4, chunk=16, context=64, lookahead=8)
    for i in range(6):
        sim.request(f"r{i}", 5 + 2 * i, max_new=20 + i)
    steps = sim.run()
    calls = [c for c in sim.session.calls if c.kind == "alloc"]
    assert len(calls) * 3 < steps, f"{len(calls)} memd calls in {steps} steps: the lookahead saves nothing"
    # a grant covers the step's need plus up to the lookahead, never beyond the context
    assert all(n <= 1 + 8 for c in calls for _, n in c.grows)
    assert {rid: r.output_ids for rid, r in sim.done.items()} == {f"r{i}": expected_outputs(20 + i) for i in range(6)}
    sim.assert_all_free()


def test_lookahead_spares_go_back_under_pressure():
    """A tight pool: the lean plan returns every spare before admissions shrink or anything is preempted."""
    sim = Sim(pages=12, max_running=5, chunk=12, context=64, lookahead=8)
    lengths = [(7, 12), (3, 20), (11, 6), (5, 15), (9, 9), (2, 25), (6, 3)]
    for i, (prompt, max_new) in enumerate(lengths):
        sim.request(f"r{i}", prompt, max_new)
    sim.run()
    lean = [c for c in sim.session.calls if c.ok and c.commits]
    assert lean, "no spare was ever given back: the pool was never short"
    assert not sim.failed
    assert {rid: r.output_ids for rid, r in sim.done.items()} == {
        f"r{i}": expected_outputs(m) for i, (_, m) in enumerate(lengths)
    }
    sim.assert_all_free()


@pytest.mark.parametrize("ahead", [False, True], ids=["waited", "sent-ahead"])
def test_lookahead_dflash_trims_carry_the_computed_length_and_spares_stay(ahead):
    """memd counts a trim's window back from the length the trim carries: the computed one, not the positions
    granted ahead; so spare slots stay granted (no commit goes with a trim) and trims ride on the calls sent ahead."""
    window, gap = 8, 4
    sim = dflash_sim(
        pages=100,
        draft_pages=40,
        window=window,
        trim_gap=gap,
        max_running=3,
        context=128,
        max_requests=4,
        lookahead=8,
        async_top_ups=ahead,
    )
    for rid, prompt in (("a", 20), ("b", 7), ("c", 33)):
        sim.request(rid, prompt, max_new=128 - prompt)
    lengths, seen, trimmed = {}, [0], [0]

    def watch(items, hopeless):
        for call in sim.session.calls[seen[0] :]:  # this step's calls, planned from the lengths before it
            assert not call.commits, "a spare went back with a trim"
            for rid, length in call.trim_lengths.items() if call.ok else []:
                assert length == lengths[rid]
                trimmed[0] += 1
        seen[0] = len(sim.session.calls)
        lengths.update({r.rid: r.computed for r in sim.sched.running})

    steps = sim.run(each=watch)
    assert trimmed[0] and len(sim.session.calls) < steps
    assert ahead == any(c.kind == "ahead" and c.trim_lengths for c in sim.session.calls)
    assert not sim.failed
    assert all(r.output_ids == expected_outputs(len(r.output_ids)) for r in sim.done.values())
    sim.assert_all_free()


def test_async_top_ups_keep_decode_steps_free_of_waiting_calls():
    """Top-ups go out after a step that needed no call and are answered while it runs: once every request is
    decoding, no step waits for memd; outputs and the KV check hold every step."""
    sim = Sim(pages=128, max_running=4, chunk=64, context=96, lookahead=8, async_top_ups=True)
    for i in range(4):
        sim.request(f"r{i}", 4 + i, max_new=60)
    waited = []

    def watch(items, hopeless):
        waited.append(sum(c.kind == "alloc" for c in sim.session.calls))

    steps = sim.run(each=watch)
    top_ups = [c for c in sim.session.calls if c.kind == "ahead"]
    assert top_ups and all(c.ok and not c.commits for c in top_ups)
    decoding = waited[2:-4]  # after the prefills, before the finishes
    assert decoding[0] == decoding[-1], f"steps waited for memd while decoding: {waited}"
    assert len(sim.session.calls) < steps
    assert {rid: r.output_ids for rid, r in sim.done.items()} == {f"r{i}": expected_outputs(60) for i in range(4)}
    sim.assert_all_free()


def test_top_ups_sent_ahead_align_a_batch_admitted_one_request_a_step():
    """Eight requests admitted one a step (the prefill budget holds one prompt) come due for top-ups on different
    steps; a call sent ahead tops up every request not at its full lookahead, so from the first one on the whole
    batch comes due together: one call with every running decode every lookahead / 2 steps (a call for the one or
    two due, nearly every step, before), until they finish one a step."""
    sim = Sim(pages=256, max_running=8, chunk=8, context=128, lookahead=8, async_top_ups=True)
    for i in range(8):
        sim.request(f"r{i}", 8, max_new=60)
    steps = sim.run()
    ahead = [len(c.grows) for c in sim.session.calls if c.kind == "ahead" and c.grows]
    assert len(ahead) * 3 < steps, f"{len(ahead)} top-up calls in {steps} steps: {ahead}"
    assert ahead.count(8) >= 8, ahead
    assert {rid: r.output_ids for rid, r in sim.done.items()} == {f"r{i}": expected_outputs(60) for i in range(8)}
    sim.assert_all_free()


def test_with_calls_sent_ahead_a_request_waits_for_memd_only_at_its_admission():
    """The prefill chunk that ends a prompt is granted the lookahead too, and releases and prompt checkpoints ride
    on the calls sent ahead: every Alloc the engine waits for admits a request; finishes go out ahead (the last
    one in the idle Free)."""
    sim = Sim(pages=128, max_running=4, chunk=64, context=96, lookahead=8, async_top_ups=True)
    lengths = [(5, 40), (7, 12), (3, 25), (6, 33)]
    for i, (prompt, max_new) in enumerate(lengths):
        sim.request(f"r{i}", prompt, max_new)
    sim.run()
    waited = [c for c in sim.session.calls if c.kind in ("alloc", "free")]
    assert all(c.extends for c in waited if c.kind == "alloc"), [c for c in waited if not c.extends]
    ahead_finishes = [rid for c in sim.session.calls if c.kind == "ahead" for rid in c.finishes]
    assert len(ahead_finishes) >= 2 and sum(len(c.finishes) for c in waited) <= 2
    assert {rid: r.output_ids for rid, r in sim.done.items()} == {
        f"r{i}": expected_outputs(m) for i, (_, m) in enumerate(lengths)
    }
    sim.assert_all_free()


def test_an_idle_pass_sends_its_releases_ahead_and_the_next_arrival_finds_them_applied():
    """Nothing running: the idle pass's releases go in a call sent ahead (no waited Free), the next pass applies
    memd's answer, and an arrival after them matches the prefix the release cached."""
    sim = Sim(pages=128, max_running=4, chunk=64, context=64, lookahead=8, async_top_ups=True)
    first = sim.request("a", 20, max_new=3)
    while "a" not in sim.done:
        sim.step()
    sim.step()  # the idle pass
    call = sim.session.calls[-1]
    assert call.kind == "ahead" and call.finishes == ["a"] and call.ok and not call.allocated
    assert not any(c.kind == "free" for c in sim.session.calls), "an idle pass waited for a Free"
    assert sim.sched.memd.releases == [] and sim.sched.memd.in_flight is not None
    again = Request(rid="b", prompt_ids=list(first.prompt_ids), params=SamplingParams(max_new_tokens=3, temperature=0))
    sim.sched.add(again)
    sim.step()  # applies the answer, then the admission
    assert "a" not in {r.rid for r in sim.mgr.requests()}
    assert again.cached_tokens == 16, "the arrival matched the pages the release cached"
    sim.run()
    assert sim.done["b"].output_ids == expected_outputs(3) and not sim.failed
    sim.assert_all_free()


class AnsweredInOrder:
    """A call sent ahead whose answer reaches modeld only with the answer of the session's next call (memd answers a
    stream's calls in order): reading it before that is the engine waiting a round trip for it (`waited`)."""

    def __init__(self, future: concurrent.futures.Future):
        self.future, self.arrived, self.waited = future, False, False

    def done(self) -> bool:
        return self.arrived

    def result(self):
        self.waited = self.waited or not self.arrived
        self.arrived = True
        return self.future.result()


class InOrderSession(FakeSession):
    """FakeSession whose calls sent ahead are answered with the next call (memd applies them at once, in order)."""

    def __init__(self, mgr: SlotManager):
        super().__init__(mgr)
        self.ahead: list[AnsweredInOrder] = []

    def alloc_async(self, *args, **kwargs):
        self.ahead.append(AnsweredInOrder(super().alloc_async(*args, **kwargs)))
        return self.ahead[-1]

    def _serve(self, call, op, *args):
        for answer in self.ahead:  # this call's answer comes after theirs
            answer.arrived = True
        return super()._serve(call, op, *args)


def test_an_arrival_after_an_idle_pass_is_matched_behind_its_releases_without_waiting_for_them():
    """Batch 1: a request finishes, the idle pass sends its release ahead, the next arrival's MatchPrefix goes out
    behind it at once (one round trip for the admission, not two), memd frees and caches first (the arrival hits
    the cached prompt), and the release's answer is applied after."""
    sim = Sim(pages=128, max_running=4, chunk=64, context=64, lookahead=8, async_top_ups=True, session=InOrderSession)
    first = sim.request("a", 20, max_new=3)
    while "a" not in sim.done:
        sim.step()
    sim.step()  # the idle pass: the release goes ahead
    release = sim.sched.memd.in_flight.future
    assert not release.done() and sim.session.calls[-1].finishes == ["a"]
    again = Request(rid="b", prompt_ids=list(first.prompt_ids), params=SamplingParams(max_new_tokens=3, temperature=0))
    sim.sched.add(again)
    sim.step()  # the admission in one MatchPrefix, sent behind the release without waiting for its answer
    assert not release.waited, "the arrival waited a round trip for the idle pass's release"
    assert sim.session.matches and again.cached_tokens == 16, "memd freed and cached before it matched"
    assert "a" not in {r.rid for r in sim.mgr.requests()}
    sim.run()
    assert sim.done["b"].output_ids == expected_outputs(3) and not sim.failed
    sim.assert_all_free()


def test_a_top_up_in_flight_is_answered_before_an_arrival_is_planned():
    """With requests running, the call in flight may grant them positions: an arrival's step waits for it first,
    as before (only an idle pass's releases let the next call go behind them)."""
    sim = Sim(pages=128, max_running=4, chunk=64, context=64, lookahead=8, async_top_ups=True, session=InOrderSession)
    sim.request("long", 5, max_new=40)
    while sim.sched.memd.in_flight is None:
        sim.step()  # decode until a top-up goes ahead
    top_up = sim.sched.memd.in_flight
    assert top_up.tops_up and not top_up.future.done()
    sim.request("late", 5, max_new=2)
    sim.step()
    assert top_up.future.waited, "an arrival was planned before the top-up in flight was answered"
    sim.run()
    assert not sim.failed and sim.done["long"].output_ids == expected_outputs(40)
    sim.assert_all_free()


def test_without_calls_sent_ahead_an_idle_pass_waits_for_its_release():
    """No lookahead, so no calls sent ahead: the idle pass's releases go in a waited Free."""
    sim = Sim(pages=128, max_running=4, chunk=64, context=64, lookahead=0, async_top_ups=True)
    sim.request("a", 5, max_new=2)
    while "a" not in sim.done:
        sim.step()
    sim.step()
    assert [c.kind for c in sim.session.calls if c.finishes == ["a"]] == ["free"]
    sim.assert_all_free()


def test_a_refused_call_sent_ahead_sends_its_releases_one_by_one():
    """A release carried by a call sent ahead names a request memd no longer holds: memd refuses the call
    (NOT_FOUND), its releases go one by one, the bad one is dropped, and the engine goes on."""
    sim = Sim(pages=128, max_running=4, chunk=64, context=64, lookahead=8, async_top_ups=True)
    sim.request("keep", 5, max_new=30)
    sim.request("x", 4, max_new=2)
    while "x" not in sim.done:
        sim.step()
    assert sim.sched.memd.releases == ["x"]  # its release goes out with the next call sent ahead
    sim.mgr.apply_release(SESSION, Release(finishes=("x",)))  # freed behind the scheduler's back
    sim.run()
    assert "NOT_FOUND" in sim.session.errors()
    assert not sim.failed and sim.done["keep"].output_ids == expected_outputs(30)
    assert not sim.sched.memd.releases and sim.sched.memd.in_flight is None
    sim.assert_all_free()


@pytest.mark.parametrize("rows", [8, 4], ids=["rows-for-all", "rows-for-four"])
def test_a_burst_of_arrivals_is_admitted_in_one_round_trip(rows):
    """Six requests arrive at once: one MatchPrefixBatch registers them and grants their prompts (one round trip, no
    Alloc). With rows for four, two stay waiting (memd has no row) and are admitted once rows are free."""
    sim = Sim(pages=128, max_running=8, chunk=64, context=64, max_requests=rows)
    for i in range(6):
        sim.request(f"r{i}", 5, max_new=4 + i)
    items, _ = sim.step()
    assert [c.kind for c in sim.session.matches] == ["match-batch"] and not sim.session.calls
    assert sim.session.matches[0].extends == [(f"r{i}", 0, 5) for i in range(min(rows, 6))]
    assert [i.req.rid for i in items] == [f"r{i}" for i in range(min(rows, 6))]
    sim.run()
    assert not sim.failed
    assert {rid: r.output_ids for rid, r in sim.done.items()} == {f"r{i}": expected_outputs(4 + i) for i in range(6)}
    sim.assert_all_free()


def test_a_burst_is_granted_in_arrival_order_until_memd_has_no_room():
    """Extensions with a burst's matches are FIFO for memory: r3 (two pages of 4 tokens) finds one page left, so
    neither it nor
    r4 (which one page would hold) is granted with its match; both wait, matched, and are admitted in order once
    the first finish frees pages."""
    sim = Sim(pages=7, max_running=8, chunk=64, context=64)  # 28 tokens
    for i, prompt in enumerate([5, 5, 5, 5, 2]):
        sim.request(f"r{i}", prompt, max_new=2)
    items, _ = sim.step()
    assert sim.session.matches[0].extends == [("r0", 0, 5), ("r1", 0, 5), ("r2", 0, 5), ("r3", 0, 0), ("r4", 0, 0)]
    assert [i.req.rid for i in items] == ["r0", "r1", "r2"]
    sim.run()
    assert not sim.failed and admissions(sim.session.rounds) == [f"r{i}" for i in range(5)]
    assert {rid: r.output_ids for rid, r in sim.done.items()} == {f"r{i}": expected_outputs(2) for i in range(5)}
    sim.assert_all_free()


def test_async_top_ups_under_pressure_keep_outputs_right():
    sim = Sim(pages=12, max_running=5, chunk=12, context=64, lookahead=8, async_top_ups=True)
    lengths = [(7, 12), (3, 20), (11, 6), (5, 15), (9, 9), (2, 25), (6, 3)]
    for i, (prompt, max_new) in enumerate(lengths):
        sim.request(f"r{i}", prompt, max_new)
    sim.run()
    assert not sim.failed
    assert {rid: r.output_ids for rid, r in sim.done.items()} == {
        f"r{i}": expected_outputs(m) for i, (_, m) in enumerate(lengths)
    }
    sim.assert_all_free()


# ---- 10. memd refuses an operation: only the request concerned fails, the engine goes on ---------


def test_a_request_freed_behind_the_schedulers_back_fails_alone():
    """Another caller frees a running request in memd: its next grow (and its release) is refused with NOT_FOUND.
    The scheduler sends the step's operations one by one, fails that request alone, drops its refused release,
    and every other request finishes with its tokens; memd ends with nothing held. (Without a lookahead, so the
    very next step asks memd; with one, the request would notice only at its next grant: sessions that no one
    else can use are what keeps others from freeing a client's requests.)"""
    sim = Sim(pages=128, max_running=4, chunk=64, context=64)
    for rid in "abc":
        sim.request(rid, 5, max_new=30)
    for _ in range(3):
        sim.step()
    sim.mgr.apply_release(SESSION, Release(finishes=("b",)))  # behind the scheduler's back
    sim.check = lambda: None  # memd no longer holds what the scheduler thinks b holds
    sim.run()
    assert set(sim.failed) == {"b"} and sim.failed["b"].finish.error_code == "NOT_FOUND"
    assert {rid: r.output_ids for rid, r in sim.done.items()} == {rid: expected_outputs(30) for rid in "ac"}
    assert "NOT_FOUND" in sim.session.errors()
    Sim.check(sim)
    sim.assert_all_free()


def test_a_refused_release_does_not_wedge_the_scheduler():
    """A finished request's release names a request memd no longer holds: the step that carries it is refused
    (NOT_FOUND), its operations go one by one, the bad release is dropped, and later steps are served."""
    sim = Sim(pages=128, max_running=4, chunk=64, context=64)
    sim.request("keep", 5, max_new=20)
    sim.request("x", 4, max_new=1)
    sim.step()  # x finishes at once: its release is pending
    assert sim.sched.memd.releases == ["x"]
    sim.mgr.apply_release(SESSION, Release(finishes=("x",)))  # freed behind the scheduler's back
    sim.run()
    assert not sim.failed and sim.done["keep"].output_ids == expected_outputs(20)
    assert not sim.sched.memd.releases
    sim.assert_all_free()


def test_a_refused_idle_release_is_dropped_and_the_rest_freed():
    sim = Sim(pages=128, max_running=4, chunk=64, context=64)
    sim.request("x", 4, max_new=1)
    sim.request("y", 4, max_new=1)
    sim.step()  # both finish at once: their releases are pending
    sim.mgr.apply_release(SESSION, Release(finishes=("x",)))  # freed behind the scheduler's back
    sim.step()  # idle: the releases go out in a Free, which memd refuses; then one by one
    assert not sim.sched.memd.releases
    sim.assert_all_free()


def test_speculation_stops_from_a_batch_size_and_resumes_under_it():
    """With speculate_below 2, two running requests decode plainly (one token each); once one finishes, the other
    verifies blocks again."""
    sim = dflash_sim(context=200)
    sim.sched.speculate_below = 2
    sim.request("long", 6, max_new=60)
    sim.request("short", 6, max_new=8)
    kinds = set(decode_kinds(sim, "long"))
    assert (2, frozenset({False})) in kinds, "two running requests never decoded plainly"
    assert (1, frozenset({True})) in kinds, "a lone request never verified again"
    assert (2, frozenset({True})) not in kinds, "two running requests verified blocks"


def decode_kinds(sim, until: str) -> list[tuple[int, frozenset]]:
    """(batch size, verify flags) of each decode step (no prompt chunk in it) until request `until` is done."""
    kinds = []
    while until not in sim.done:
        items, _ = sim.step()
        if all(item.req.output_ids for item in items):
            kinds.append((len(items), frozenset(item.verify for item in items)))
    return kinds


def policy_favouring_greedy_verify() -> SpeculationPolicy:
    """A speculation policy whose measured costs make verifying pay for greedy batches and lose for any batch with a
    sampled request, at every bucket this file's batches reach (explorations far away)."""
    policy = SpeculationPolicy()
    for bucket in (1, 2, 4, 8):
        for sampling, (verify, plain) in ((False, (0.001, 1.0)), (True, (1.0, 0.001))):
            costs = policy.costs[(bucket, sampling)] = BucketCosts(interval=REEXPLORE_MAX)
            costs.seconds[True] = RunningMean(verify, 1000)
            costs.seconds[False] = RunningMean(plain, 1000)
    return policy


def test_the_speculation_policy_decides_each_step_below_the_cap():
    """With a policy below no cap: two greedy requests verify blocks together; a greedy and a sampled request
    (a batch whose verify steps the policy measured to lose) decode plainly together, and the greedy one verifies
    again once the sampled one is done. Every decode-only pass teaches the policy what its verifies committed."""
    sim = dflash_sim(context=200)
    sim.sched.speculate_below, sim.sched.policy = 0, policy_favouring_greedy_verify()
    sim.request("a", 6, max_new=20)
    sim.request("b", 6, max_new=8)
    assert (2, frozenset({True})) in decode_kinds(sim, "a"), "two greedy requests never verified together"
    assert sim.sched.policy.accept.count > 0 and sim.sched.policy.accept.value > 1, "no verify reached the policy"
    assert not sim.sched.policy.per_request, "finished requests are still in the policy"
    sim.request("greedy", 6, max_new=60)
    sim.request("sampled", 6, max_new=8, temperature=0.8)
    kinds = decode_kinds(sim, "greedy")
    assert (2, frozenset({False})) in kinds, "a greedy and a sampled request never decoded plainly together"
    assert (2, frozenset({True})) not in kinds, "a batch with a sampled request verified blocks"
    assert kinds[-1] == (1, frozenset({True})), "the greedy request did not verify again once alone"
    sim.run()
    sim.assert_all_free()


@pytest.mark.parametrize(
    "pages, cached_len, prompt_len, chunk, steps_before",
    [
        (5, 8, 16, 12, 1),  # the new prompt is mid-prefill when the match locks the cache: asked again at level 1
        (5, 16, 12, 12, 0),  # both arrive at an idle pool: the match goes back before the first is given up
    ],
)
def test_a_waiting_match_gives_its_locked_prefix_back_before_a_request_that_fits_is_failed(
    pages, cached_len, prompt_len, chunk, steps_before
):
    """A finished request's prompt is cached; a new prompt that fits the pool alone, then an arrival that matches the
    cached prompt (locking its pages), compete for the pool: the arrival's match goes back (its prefix then
    evictable), and every request completes, with the same tokens, and nothing is left held."""
    sim = Sim(pages=pages, max_running=2, chunk=chunk, context=64)
    first = sim.request("a", cached_len, max_new=1)
    while "a" not in sim.done:
        sim.step()
    sim.step()  # idle: the release caches a's prompt
    sim.request("r", prompt_len, max_new=1)
    for _ in range(steps_before):
        sim.step()
    again = Request(rid="w", prompt_ids=list(first.prompt_ids), params=SamplingParams(max_new_tokens=1, temperature=0))
    sim.engine.requests["w"] = again
    sim.sched.add(again)
    sim.run()
    assert not sim.failed, {rid: req.finish.error for rid, req in sim.failed.items()}
    assert sim.done["r"].output_ids == sim.done["w"].output_ids == expected_outputs(1)
    sim.assert_all_free()
