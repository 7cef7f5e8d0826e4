"""Randomized tests of memd's two-sided slot allocator (memd.slots.SlotManager).

A hypothesis state machine drives long sequences of scheduler steps (prefill of new requests,
chunked extends, decode/verify blocks and the commits that keep part of them, out-of-window
trims, finishes, lost sessions, batches mixing all of these, and calls that ask for more than
fits or are malformed) against a plain reference model built only from what the allocator
returned and what the test released. After every step the manager is compared with the model
and every promise of the memory model (DESIGN.md "Memory model") is checked. The deterministic
tests at the end re-express SGLang's known SWA-memory bugs (reference/swa-memory.md section 7).
"""

import itertools
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from memd.errors import FailedPrecondition, InvalidArgument, InvariantViolation, MemdError, NotFound, ResourceExhausted
from memd.invariants import check_leak, check_structure
from memd.pages import PagePool
from memd.slots import DraftMode, Release, SlotManager

BOUNDED, IDENTITY = DraftMode.BOUNDED, DraftMode.IDENTITY


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Cfg:
    P: int
    mode: DraftMode
    target_pages: int
    draft_pages: int
    window: int
    trim_gap: int
    max_requests: int = 5
    ctx_pages: int = 12
    block: int = 4

    @property
    def ctx(self) -> int:
        return self.ctx_pages * self.P

    @property
    def bounded(self) -> bool:
        return self.mode is BOUNDED


def make_mgr(cfg: Cfg, on_write=None) -> SlotManager:
    return SlotManager(
        target_pages=cfg.target_pages,
        draft_pages=cfg.draft_pages,
        page_size=cfg.P,
        mode=cfg.mode,
        window=cfg.window,
        trim_gap=cfg.trim_gap,
        max_requests=cfg.max_requests,
        context_len=cfg.ctx,
        mapping=np.zeros((cfg.target_pages + 1) * cfg.P, np.int32),
        req_to_token=np.zeros((cfg.max_requests + 1, cfg.ctx), np.int32),
        on_write=on_write,
    )


# ---- the reference model -----------------------------------------------------------------


@dataclass
class RefReq:
    row: int
    target: list[int] = field(default_factory=list)  # target slot by position
    draft: list[int] = field(default_factory=list)  # draft slot by position, 0 where none
    draft_start: int = 0
    block_base: int | None = None  # length before the verify block in flight
    trimmed: bool = False
    since_trim: int = 0  # tokens allocated since the last trim

    @property
    def length(self) -> int:
        return len(self.target)

    def target_pages(self, P: int) -> list[int]:
        return [self.target[p] // P for p in range(0, self.length, P)]

    def draft_pages(self, P: int) -> list[int]:
        return [self.draft[p] // P for p in range(0, self.length, P)]

    def draft_page_set(self, P: int, start: int, end: int) -> set[int]:
        return {self.draft[p] // P for p in range(start, end)}


@dataclass
class Plan:
    errors: set  # exception types one of which the call must raise; empty: it must succeed
    freed_t: int = 0  # pages the release returns, per side
    freed_d: int = 0
    need: int = 0  # pages the allocations take, per side
    new_rows: int = 0


class Ref:
    def __init__(self, cfg: Cfg):
        self.cfg = cfg
        self.sessions: dict[str, dict[str, RefReq]] = {}
        self.free_t = cfg.target_pages
        self.free_d = cfg.draft_pages if cfg.bounded else 0
        self.free_rows = cfg.max_requests
        self.freed_slots: set[int] = set()  # target slots released (and maybe handed out again since)
        self.finished_names: dict[str, list[str]] = {}

    def all_reqs(self):
        for held in self.sessions.values():
            yield from held.values()

    def frontier(self, length: int, draft_start: int) -> int:
        """Where a trim moves draft_start: page aligned, keeping the last `window`, gated by trim_gap."""
        cfg = self.cfg
        if not cfg.bounded:
            return draft_start
        f = max(0, length - cfg.window) // cfg.P * cfg.P
        return f if f - draft_start >= max(cfg.trim_gap, 1) else draft_start

    def plan(self, session, commits, trims, finishes, extends=(), grows=()) -> Plan:
        cfg, P = self.cfg, self.cfg.P
        if session not in self.sessions:
            return Plan({NotFound})
        held = self.sessions[session]
        errs = set()
        for rids in ([r for r, _ in commits], list(trims), list(finishes)):
            if len(set(rids)) != len(rids):
                errs.add(InvalidArgument)
            if any(r not in held for r in rids):
                errs.add(NotFound)
        if errs:
            return Plan(errs)
        for rid, c in commits:
            if not held[rid].draft_start <= c <= held[rid].length:
                return Plan({InvalidArgument})
        post = {}
        for rid, c in commits:
            post[rid] = (c, held[rid].draft_start)
        for rid in trims:
            length, ds = post.get(rid, (held[rid].length, held[rid].draft_start))
            post[rid] = (length, self.frontier(length, ds))
        for rid in finishes:
            post[rid] = None
        # allocations
        seen, new_rows, need = set(), 0, 0
        for kind, rid, prefix, n in [("e", r, pl, n) for r, pl, n in extends] + [("g", r, None, n) for r, n in grows]:
            if not rid or rid in seen or (rid in post and post[rid] is None) or n < 1:
                errs.add(InvalidArgument)
                seen.add(rid)
                continue
            seen.add(rid)
            if rid not in held:
                if kind == "g":
                    errs.add(NotFound)
                    continue
                if prefix != 0:
                    errs.add(FailedPrecondition)
                    continue
                new_rows += 1
                length = 0
            else:
                length = post[rid][0] if rid in post else held[rid].length
                if kind == "e" and prefix != length:
                    errs.add(InvalidArgument)
                    continue
            if length + n > cfg.ctx:
                errs.add(InvalidArgument)
                continue
            need += cdiv(length + n, P) - cdiv(length, P)
        if errs:
            return Plan(errs)
        freed_t = freed_d = 0
        for rid, state in post.items():
            r = held[rid]
            before_d = r.draft_page_set(P, r.draft_start, r.length) if cfg.bounded else set()
            if state is None:
                freed_t += cdiv(r.length, P)
                freed_d += len(before_d)
                continue
            length, ds = state
            freed_t += cdiv(r.length, P) - cdiv(length, P)
            if cfg.bounded:
                freed_d += len(before_d - r.draft_page_set(P, ds, length))
        plan = Plan(set(), freed_t, freed_d, need, new_rows)
        if need > self.free_t + freed_t or new_rows > self.free_rows + len(finishes):
            plan.errors.add(ResourceExhausted)
        if cfg.bounded and need > self.free_d + freed_d:
            plan.errors.add(ResourceExhausted)
        return plan

    def release(self, session, commits, trims, finishes, plan: Plan) -> list[str]:
        held = self.sessions[session]
        for rid, c in commits:
            r = held[rid]
            self.freed_slots.update(r.target[c:])
            del r.target[c:]
            del r.draft[c:]
            r.block_base = None
        trimmed = []
        for rid in trims:
            r = held[rid]
            f = self.frontier(r.length, r.draft_start)
            if f != r.draft_start:
                event("a trim freed draft pages")
            r.draft[r.draft_start : f] = [0] * (f - r.draft_start)
            r.draft_start = f
            r.trimmed, r.since_trim = True, 0
            trimmed.append(rid)
        for rid in finishes:
            r = held.pop(rid)
            self.freed_slots.update(r.target)
            self.free_rows += 1
            self.finished_names.setdefault(session, []).append(rid)
        self.free_t += plan.freed_t
        self.free_d += plan.freed_d
        return trimmed

    def close(self, session):
        cfg, P = self.cfg, self.cfg.P
        for rid, r in self.sessions.pop(session).items():
            self.free_t += cdiv(r.length, P)
            if cfg.bounded:
                self.free_d += len(r.draft_page_set(P, r.draft_start, r.length))
            self.freed_slots.update(r.target)
            self.free_rows += 1
        self.finished_names.pop(session, None)


# ---- snapshots: "nothing changed" ----------------------------------------------------------------


def snapshot(mgr: SlotManager) -> dict:
    snap = {
        "target_free": list(mgr.target._free),
        "target_is_free": mgr.target._is_free.copy(),
        "mapping": mgr.mapping.copy(),
        "req_to_token": mgr.req_to_token.copy(),
        "free_rows": list(mgr.free_rows),
        "sessions": {s: sorted(held) for s, held in mgr.sessions.items()},
        "requests": {
            (r.session, r.rid): (r.row, list(r.target_pages), list(r.draft_pages), r.length, r.draft_start)
            for r in mgr.requests()
        },
    }
    if mgr.draft is not None:
        snap["draft_free"] = list(mgr.draft._free)
        snap["draft_is_free"] = mgr.draft._is_free.copy()
    return snap


def assert_unchanged(before: dict, after: dict, what: str) -> None:
    assert before.keys() == after.keys()
    for key in before:
        a, b = before[key], after[key]
        same = np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b
        assert same, f"{what} changed {key}"


# ---- the state machine ---------------------------------------------------------------------------


class SlotMachine(RuleBasedStateMachine):
    CFG: Cfg = None  # set per configuration by _machine()

    def __init__(self):
        super().__init__()
        self.cfg = self.CFG
        self.writes = []
        self.mgr = make_mgr(self.cfg, on_write=lambda name, idx, values: self.writes.append(name))
        self.ref = Ref(self.cfg)
        self.names = itertools.count()
        self.session_names = itertools.count()

    # ---- helpers ----
    def tokens(self, data, hi: int, label: str) -> int:
        P = self.cfg.P
        hi = max(1, hi)
        if P == 1:
            return data.draw(st.integers(1, hi), label=label)
        edges = sorted(
            {v for v in (1, P - 1, P, P + 1, 2 * P - 1, 2 * P, 2 * P + 1, 3 * P, 4 * P + 3, 5 * P) if v <= hi}
        )
        return data.draw(st.one_of(st.integers(1, hi), st.sampled_from(edges)), label=label)

    def prefill_hi(self):
        return 8 if self.cfg.P == 1 else 5 * self.cfg.P

    def chunk_hi(self):
        return 6 if self.cfg.P == 1 else 3 * self.cfg.P

    def new_rid(self, data, session: str) -> str:
        old = [n for n in self.ref.finished_names.get(session, []) if n not in self.ref.sessions[session]]
        other = sorted(
            {rid for s, held in self.ref.sessions.items() if s != session for rid in held}
            - set(self.ref.sessions[session])
        )
        how = data.draw(st.sampled_from(["fresh", "fresh", "fresh", "reuse", "other_session"]), label="rid kind")
        if how == "reuse" and old:
            return data.draw(st.sampled_from(sorted(set(old))), label="reused rid")
        if how == "other_session" and other:
            return data.draw(st.sampled_from(other), label="rid of another session")
        return f"r{next(self.names)}"

    def pick_session(self, data, with_requests=False):
        names = sorted(s for s, held in self.ref.sessions.items() if held or not with_requests)
        return data.draw(st.sampled_from(names), label="session")

    def pick_rids(self, data, session, label, pred=lambda r: True, min_size=1):
        held = self.ref.sessions[session]
        rids = sorted(rid for rid, r in held.items() if pred(r))
        if not rids or len(rids) < min_size:
            return []
        return data.draw(
            st.lists(st.sampled_from(rids), min_size=min_size, max_size=len(rids), unique=True), label=label
        )

    def has_requests(self):
        return any(self.ref.sessions.values())

    # ---- the step, checked against the model ----
    def do_step(self, session, commits=(), trims=(), finishes=(), extends=(), grows=(), free_only=False):
        commits, trims, finishes = tuple(commits), tuple(trims), tuple(finishes)
        extends, grows = list(extends), list(grows)
        plan = self.ref.plan(session, commits, trims, finishes, extends, grows)
        before = snapshot(self.mgr)
        self.writes.clear()
        release = Release(commits, trims, finishes)
        call = f"{'apply_release' if free_only else 'step'}({session!r}, {release}, extends={extends}, grows={grows})"
        try:
            if free_only:
                out = self.mgr.apply_release(session, release)
            else:
                out = self.mgr.step(session, release, extends=extends, grows=grows)
        except InvariantViolation:
            raise
        except MemdError as e:
            event(f"outcome: {type(e).__name__}")
            assert plan.errors, f"{call} raised {e!r}; the model expected success"
            assert type(e) in plan.errors, f"{call} raised {e!r}; the model expected one of {plan.errors}"
            assert not self.writes, f"{call} failed with {e!r} but wrote {self.writes}"
            assert_unchanged(before, snapshot(self.mgr), f"{call} failed with {e!r} but")
            self.check_all()
            return None
        assert not plan.errors, f"{call} succeeded; the model expected one of {plan.errors}"
        event(f"outcome: ok ({'free' if free_only else 'step'})")
        trimmed = self.ref.release(session, commits, trims, finishes, plan)
        if free_only:
            freed_t, freed_d = out
            assert freed_t == plan.freed_t * self.cfg.P, (call, out, plan)
            expect_d = plan.freed_d if self.cfg.bounded else plan.freed_t
            assert freed_d == expect_d * self.cfg.P, (call, out, plan)
        else:
            self.check_allocated(session, extends, grows, out, plan)
        self.check_trimmed(session, trimmed)
        self.check_all()
        return out

    def check_allocated(self, session, extends, grows, out, plan: Plan):
        cfg, P, ref = self.cfg, self.cfg.P, self.ref
        held = ref.sessions[session]
        asked = [(rid, n) for rid, _, n in extends] + list(grows)
        assert [a.rid for a in out] == [rid for rid, _ in asked]
        taken_t = {p for r in ref.all_reqs() for p in r.target_pages(P)}
        taken_d = {p for r in ref.all_reqs() for p in r.draft_page_set(P, r.draft_start, r.length)}
        rows = {r.row for r in ref.all_reqs()}
        new_t = new_d = 0
        for a, (rid, n) in zip(out, asked):
            r = held.get(rid)
            if r is None:
                assert 1 <= a.row <= cfg.max_requests and a.row not in rows, f"row {a.row} of new {rid!r} is in use"
                r = held[rid] = RefReq(row=a.row)
                rows.add(a.row)
                ref.free_rows -= 1
            assert a.row == r.row and a.start == r.length, (a, r.row, r.length)
            t = np.asarray(a.target_slots)
            d = np.asarray(a.draft_slots)
            assert t.shape == (n,) and d.shape == (n,)
            for i in range(n):
                p, ti, di = a.start + i, int(t[i]), int(d[i])
                assert P <= ti < (cfg.target_pages + 1) * P, (
                    f"{rid!r} pos {p}: target slot {ti} out of range or in page 0"
                )
                assert ti % P == p % P, f"{rid!r} pos {p}: target slot {ti} at the wrong in-page offset"
                if p % P:
                    assert ti // P == r.target[p - p % P] // P, f"{rid!r} pos {p}: left its page"
                else:
                    assert ti // P not in taken_t, f"{rid!r} pos {p}: target page {ti // P} is already held"
                    taken_t.add(ti // P)
                    new_t += 1
                if cfg.bounded:
                    assert P <= di < (cfg.draft_pages + 1) * P, (
                        f"{rid!r} pos {p}: draft slot {di} out of range or in page 0"
                    )
                    assert di % P == p % P, f"{rid!r} pos {p}: draft slot {di} at the wrong in-page offset"
                    if p % P:
                        assert di // P == r.draft[p - p % P] // P, f"{rid!r} pos {p}: left its draft page"
                    else:
                        assert di // P not in taken_d, f"{rid!r} pos {p}: draft page {di // P} is already held"
                        taken_d.add(di // P)
                        new_d += 1
                else:
                    assert di == ti, f"{rid!r} pos {p}: identity draft slot {di} != target slot {ti}"
                r.target.append(ti)
                r.draft.append(di)
            r.since_trim += n
        assert new_t == plan.need, (new_t, plan.need)
        ref.free_t -= new_t
        if cfg.bounded:
            assert new_d == plan.need, (new_d, plan.need)
            ref.free_d -= new_d

    def check_trimmed(self, session, trimmed):
        """Right after a trim no draft slot is older than the frontier (page aligned, last `window` kept)."""
        cfg, P = self.cfg, self.cfg.P
        for rid in trimmed:
            if rid not in self.ref.sessions[session]:
                continue  # finished in the same release
            m, r = self.mgr.sessions[session][rid], self.ref.sessions[session][rid]
            at_trim = m.length - r.since_trim  # the same step may have grown it after the trim
            if cfg.bounded:
                assert m.draft_start % P == 0
                assert at_trim - m.draft_start <= cfg.window + P - 1 + max(cfg.trim_gap, 1) - 1, (
                    rid,
                    at_trim,
                    m.draft_start,
                )
                if cfg.trim_gap == 0:
                    assert m.draft_start >= max(0, at_trim - cfg.window) // P * P, (rid, at_trim, m.draft_start)
                slots = np.asarray(r.target[: m.draft_start], np.int64)
                assert not self.mgr.mapping[slots].any(), f"{rid!r}: trimmed positions still map to draft slots"
            else:
                assert m.draft_start == 0

    def check_all(self):
        cfg, P, mgr, ref = self.cfg, self.cfg.P, self.mgr, self.ref
        check_structure(mgr)
        # -- the manager holds what the model holds
        assert set(mgr.sessions) == set(ref.sessions)
        for s, held in ref.sessions.items():
            assert set(mgr.sessions[s]) == set(held), (s, sorted(mgr.sessions[s]), sorted(held))
            for rid, r in held.items():
                m = mgr.sessions[s][rid]
                assert (m.row, m.length, m.draft_start) == (r.row, r.length, r.draft_start), (s, rid)
                assert m.target_pages == r.target_pages(P), (s, rid)
                if cfg.bounded:
                    assert m.draft_pages == r.draft_pages(P), (s, rid)
        # -- mapping and req_to_token, rebuilt from the model alone
        exp_map = np.zeros_like(mgr.mapping)
        exp_rows = np.zeros_like(mgr.req_to_token)
        live_draft, live_target = [], []
        for r in ref.all_reqs():
            exp_rows[r.row, : r.length] = r.target
            live_target += r.target
            for p in range(r.length):
                if cfg.bounded and p < r.draft_start:
                    assert r.draft[p] == 0
                    continue
                assert r.draft[p] >= P
                exp_map[r.target[p]] = r.draft[p]
                live_draft.append(r.draft[p])
        assert len(set(live_target)) == len(live_target), "a target slot is held twice"
        assert len(set(live_draft)) == len(live_draft), "the mapping is not injective on live slots"
        if not np.array_equal(mgr.mapping, exp_map):
            bad = np.flatnonzero(mgr.mapping != exp_map)[:8]
            raise AssertionError(f"mapping wrong at target slots {bad.tolist()}: {mgr.mapping[bad]} != {exp_map[bad]}")
        if cfg.mode is IDENTITY:
            live = np.asarray(live_target, np.int64)
            assert np.array_equal(mgr.mapping[live], live)
        assert np.array_equal(mgr.req_to_token, exp_rows), "req_to_token disagrees with the model"
        # -- pages: held once, never free and held, page 0 never anywhere, free + used == total
        sides = [("target", mgr.target, [p for r in ref.all_reqs() for p in r.target_pages(P)], ref.free_t)]
        if cfg.bounded:
            held_d = [p for r in ref.all_reqs() for p in sorted(r.draft_page_set(P, r.draft_start, r.length))]
            sides.append(("draft", mgr.draft, held_d, ref.free_d))
        for side, pool, held_pages, ref_free in sides:
            free = list(pool._free)
            assert len(set(held_pages)) == len(held_pages), f"{side}: a page is held twice"
            assert len(set(free)) == len(free), f"{side}: a page is free twice"
            assert 0 not in free and 0 not in held_pages, f"{side}: page 0 is in use or free"
            assert not set(free) & set(held_pages), f"{side}: pages both free and held: {set(free) & set(held_pages)}"
            assert pool.free_pages == len(free) == ref_free, (side, pool.free_pages, ref_free)
            assert pool.free_pages + len(held_pages) == pool.num_pages, f"{side}: free + used != total"
            assert set(free) | set(held_pages) == set(range(1, pool.num_pages + 1))
        # -- rows
        rows = [r.row for r in ref.all_reqs()]
        assert len(mgr.free_rows) == ref.free_rows and not set(mgr.free_rows) & set(rows)
        assert len(set(mgr.free_rows)) == len(mgr.free_rows) and 0 not in mgr.free_rows
        # -- draft window of trimmed requests
        if cfg.bounded:
            slack = cfg.window + P - 1 + max(cfg.trim_gap, 1) - 1
            for r in ref.all_reqs():
                if r.trimmed:
                    assert r.length - r.draft_start <= slack + r.since_trim, (r.length, r.draft_start, r.since_trim)
        # -- translate
        everything = np.arange(P, len(mgr.mapping))
        assert np.array_equal(mgr.translate(everything), exp_map[P:])
        ref.freed_slots -= set(live_target)
        if ref.freed_slots:
            freed = np.asarray(sorted(ref.freed_slots), np.int64)
            assert not mgr.translate(freed).any(), "a freed target slot still translates to a draft slot"
        if live_target:
            live = np.asarray(live_target, np.int64)
            assert np.array_equal(mgr.translate(live), exp_map[live])
        for bad in ([0], [P - 1], [len(mgr.mapping)], [-1], [P, 0], [len(mgr.mapping) - 1, len(mgr.mapping) + 5]):
            with pytest.raises(InvalidArgument):
                mgr.translate(np.asarray(bad))

    # ---- rules ----
    @initialize()
    def first_session(self):
        name = f"s{next(self.session_names)}"
        self.mgr.open_session(name, model="m")
        self.ref.sessions[name] = {}
        self.check_all()

    @precondition(lambda self: len(self.ref.sessions) < 3)
    @rule()
    def open_session(self):
        name = f"s{next(self.session_names)}"
        self.mgr.open_session(name, model="m")
        self.ref.sessions[name] = {}
        self.check_all()

    @precondition(lambda self: self.ref.sessions)
    @rule(data=st.data())
    def lose_session(self, data):
        session = self.pick_session(data)
        self.mgr.close_session(session)
        self.ref.close(session)
        self.check_all()

    @rule(data=st.data())
    def unknown_session(self, data):
        """Steps and closes of a session that is gone change nothing."""
        gone = f"s{next(self.session_names)}"
        before = snapshot(self.mgr)
        self.mgr.close_session(gone)
        assert_unchanged(before, snapshot(self.mgr), "closing an unknown session")
        self.do_step(gone, extends=[("x", 0, 1)])
        self.do_step(gone, finishes=["x"], free_only=True)

    @precondition(lambda self: self.ref.sessions)
    @rule(data=st.data())
    def prefill(self, data):
        """New requests (several in one call), maybe with decode blocks of running ones."""
        session = self.pick_session(data)
        extends, names = [], set()
        for _ in range(data.draw(st.integers(1, 3), label="new requests")):
            rid = self.new_rid(data, session)
            if rid in names:
                continue
            names.add(rid)
            extends.append((rid, 0, self.tokens(data, self.prefill_hi(), "prefill tokens")))
        grows = []
        if data.draw(st.booleans(), label="with decode"):
            grows = [(rid, self.cfg.block) for rid in self.pick_rids(data, session, "decoding", min_size=0)]
        self.do_step(session, extends=extends, grows=grows)

    @precondition(lambda self: self.has_requests())
    @rule(data=st.data())
    def chunked_extend(self, data):
        session = self.pick_session(data, with_requests=True)
        [rid] = self.pick_rids(data, session, "rid", min_size=1)[:1]
        length = self.ref.sessions[session][rid].length
        room = self.cfg.ctx - length
        how = data.draw(
            st.sampled_from(["chunk"] * 4 + ["fill_page", "fill_context", "overflow", "bad_prefix"]), label="how"
        )
        n = self.tokens(data, min(self.chunk_hi(), max(room, 1)), "chunk tokens")
        prefix = length
        if how == "fill_page":
            n = (-length) % self.cfg.P or self.cfg.P
        elif how == "fill_context":
            n = max(room, 1)
        elif how == "overflow":
            n = room + data.draw(st.integers(1, 3), label="beyond context")
        elif how == "bad_prefix":
            prefix = length + data.draw(st.sampled_from([-1, 1]), label="prefix error")
        trims = [rid] if data.draw(st.booleans(), label="trim first") else []  # chunked prefill past the window
        self.do_step(session, trims=trims, extends=[(rid, prefix, n)])

    @precondition(lambda self: self.has_requests())
    @rule(data=st.data())
    def decode_block(self, data):
        """Grow a block of draft tokens for verification, for several requests in one call."""
        session = self.pick_session(data, with_requests=True)
        rids = self.pick_rids(data, session, "decoding")
        held = self.ref.sessions[session]
        bases = {rid: held[rid].length for rid in rids}
        if self.do_step(session, grows=[(rid, self.cfg.block) for rid in rids]) is not None:
            for rid in rids:
                held[rid].block_base = bases[rid]

    @precondition(lambda self: any(r.block_base is not None for r in self.ref.all_reqs()))
    @rule(data=st.data())
    def verify(self, data):
        """Commit keeps part of the verified block; maybe trim and grow the next block in the same step."""
        sessions = sorted(
            s for s, held in self.ref.sessions.items() if any(r.block_base is not None for r in held.values())
        )
        session = data.draw(st.sampled_from(sessions), label="session")
        held = self.ref.sessions[session]
        rids = self.pick_rids(data, session, "verified", pred=lambda r: r.block_base is not None)
        commits = []
        for rid in rids:
            r = held[rid]
            keep = data.draw(st.integers(0, self.cfg.block), label="accepted")
            commits.append((rid, max(r.draft_start, min(r.length, r.block_base + keep))))
        trims = [rid for rid in rids if data.draw(st.booleans(), label="trim")]
        again = data.draw(st.booleans(), label="next block")
        grows = [(rid, self.cfg.block) for rid in rids] if again else []
        if self.do_step(session, commits=commits, trims=trims, grows=grows) is not None and again:
            for rid, c in commits:
                held[rid].block_base = c

    @precondition(lambda self: self.has_requests())
    @rule(data=st.data())
    def trim(self, data):
        session = self.pick_session(data, with_requests=True)
        rids = self.pick_rids(data, session, "trimmed")
        grows = []
        if data.draw(st.booleans(), label="with decode"):
            grows = [(rid, self.cfg.block) for rid in self.pick_rids(data, session, "decoding", min_size=0)]
        self.do_step(session, trims=rids, grows=grows)

    @precondition(lambda self: self.has_requests())
    @rule(data=st.data())
    def finish(self, data):
        """Finish requests, maybe admitting a new one into what they free in the same call."""
        session = self.pick_session(data, with_requests=True)
        rids = self.pick_rids(data, session, "finished")
        extends = []
        if data.draw(st.booleans(), label="admit"):
            rid = f"r{next(self.names)}"
            extends = [(rid, 0, self.tokens(data, self.prefill_hi(), "prefill tokens"))]
        free_only = not extends and data.draw(st.booleans(), label="via apply_release")
        self.do_step(session, finishes=rids, extends=extends, free_only=free_only)

    @precondition(lambda self: self.ref.sessions)
    @rule(data=st.data())
    def oversubscribe(self, data):
        """Ask for just more (or exactly) what is free, over new requests."""
        cfg = self.cfg
        session = self.pick_session(data)
        free_pages = min(self.ref.free_t, self.ref.free_d) if cfg.bounded else self.ref.free_t
        total = free_pages * cfg.P + data.draw(st.sampled_from([1, 1, 1, 0, -1]), label="margin")
        extends = []
        while total > 0 and len(extends) < cfg.max_requests + 1:
            n = min(total, cfg.ctx)
            extends.append((f"r{next(self.names)}", 0, n))
            total -= cfg.ctx  # each request takes whole pages: at most ctx tokens each
        if extends:
            self.do_step(session, extends=extends)

    @precondition(lambda self: self.ref.sessions)
    @rule(data=st.data())
    def batched(self, data):
        """One call mixing commits, trims, finishes, extends and grows, sometimes malformed."""
        cfg = self.cfg
        session = self.pick_session(data)
        held = self.ref.sessions[session]
        commits, trims, finishes, extends, grows = [], [], [], [], []
        for rid in sorted(held):
            r = held[rid]
            act = data.draw(
                st.sampled_from(["none", "commit", "trim", "finish", "commit_trim", "commit_finish", "trim_finish"]),
                label=f"{rid} release",
            )
            length = r.length
            if "commit" in act:
                length = data.draw(st.integers(r.draft_start, r.length), label=f"{rid} commit")
                commits.append((rid, length))
            if "trim" in act:
                trims.append(rid)
            if "finish" in act:
                finishes.append(rid)
                continue
            alloc = data.draw(st.sampled_from(["none", "none", "extend", "grow"]), label=f"{rid} alloc")
            if alloc == "extend":
                extends.append(
                    (rid, length, self.tokens(data, min(self.chunk_hi(), max(cfg.ctx - length, 1)), "chunk"))
                )
            elif alloc == "grow":
                grows.append((rid, cfg.block))
        for _ in range(data.draw(st.integers(0, 2), label="new requests")):
            rid = self.new_rid(data, session)
            if rid not in held and all(rid != e[0] for e in extends):
                extends.append((rid, 0, self.tokens(data, self.prefill_hi(), "prefill tokens")))
        bogus = data.draw(
            st.sampled_from(
                ["none"] * 6
                + [
                    "bad_commit",
                    "unknown_finish",
                    "dup_trim",
                    "new_with_prefix",
                    "grow_unknown",
                    "zero_tokens",
                    "empty_rid",
                    "finish_and_grow",
                    "grow_twice",
                    "beyond_context",
                ]
            ),
            label="malformed",
        )
        rids = sorted(held)
        if bogus == "bad_commit" and rids:
            r = held[rids[0]]
            bad = data.draw(st.sampled_from([r.length + 1, r.draft_start - 1]), label="bad length")
            commits = [c for c in commits if c[0] != rids[0]] + [(rids[0], bad)]
        elif bogus == "unknown_finish":
            finishes.append("nobody")
        elif bogus == "dup_trim" and rids:
            trims += [rids[0], rids[0]]
        elif bogus == "new_with_prefix":
            extends.append((f"r{next(self.names)}", data.draw(st.integers(1, 5), label="prefix"), 1))
        elif bogus == "grow_unknown":
            grows.append(("nobody", cfg.block))
        elif bogus == "zero_tokens":
            extends.append((f"r{next(self.names)}", 0, 0))
        elif bogus == "empty_rid":
            grows.append(("", 1))
        elif bogus == "finish_and_grow" and finishes:
            grows.append((finishes[0], cfg.block))
        elif bogus == "grow_twice" and rids:
            grows += [(rids[-1], 1), (rids[-1], 1)]
        elif bogus == "beyond_context":
            extends.append((f"r{next(self.names)}", 0, cfg.ctx + 1))
        self.do_step(session, commits=commits, trims=trims, finishes=finishes, extends=extends, grows=grows)

    @precondition(lambda self: self.has_requests())
    @rule(data=st.data())
    def free_only(self, data):
        """A release on its own (the Free RPC): commits, trims and finishes."""
        session = self.pick_session(data, with_requests=True)
        held = self.ref.sessions[session]
        rids = self.pick_rids(data, session, "released")
        commits = [
            (rid, data.draw(st.integers(held[rid].draft_start, held[rid].length), label="commit"))
            for rid in rids
            if data.draw(st.booleans(), label="commit?")
        ]
        trims = [rid for rid in rids if data.draw(st.booleans(), label="trim?")]
        finishes = [rid for rid in rids if data.draw(st.booleans(), label="finish?")]
        self.do_step(session, commits=commits, trims=trims, finishes=finishes, free_only=True)

    @invariant()
    def leak_invariant(self):
        check_leak(self.mgr)


CONFIGS = {
    # page 1: small pools so ResourceExhausted is common; context 12 tokens, window 3 tokens
    "p1_bounded": Cfg(P=1, mode=BOUNDED, target_pages=40, draft_pages=12, window=3, trim_gap=0),
    "p1_bounded_gap": Cfg(P=1, mode=BOUNDED, target_pages=40, draft_pages=12, window=2, trim_gap=3),
    "p1_identity": Cfg(P=1, mode=IDENTITY, target_pages=40, draft_pages=0, window=3, trim_gap=0),
    # page 64: 12 target pages, 5 draft pages; context 12 pages, window 2.5 pages
    "p64_bounded": Cfg(P=64, mode=BOUNDED, target_pages=12, draft_pages=5, window=160, trim_gap=0),
    "p64_bounded_gap": Cfg(P=64, mode=BOUNDED, target_pages=12, draft_pages=5, window=128, trim_gap=100),
    "p64_identity": Cfg(P=64, mode=IDENTITY, target_pages=12, draft_pages=0, window=160, trim_gap=0),
}

SETTINGS = settings(
    max_examples=60,
    stateful_step_count=60,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)


def _machine(name: str, cfg: Cfg):
    machine = type(f"SlotMachine_{name}", (SlotMachine,), {"CFG": cfg})
    case = machine.TestCase
    case.settings = SETTINGS
    return case


TestP1Bounded = _machine("p1_bounded", CONFIGS["p1_bounded"])
TestP1BoundedTrimGap = _machine("p1_bounded_gap", CONFIGS["p1_bounded_gap"])
TestP1Identity = _machine("p1_identity", CONFIGS["p1_identity"])
TestP64Bounded = _machine("p64_bounded", CONFIGS["p64_bounded"])
TestP64BoundedTrimGap = _machine("p64_bounded_gap", CONFIGS["p64_bounded_gap"])
TestP64Identity = _machine("p64_identity", CONFIGS["p64_identity"])


# ---- deterministic regressions: SGLang's known SWA-memory bugs (swa-memory.md section 7) ---------


def mgr_for(P, mode=BOUNDED, target_pages=8, draft_pages=8, window=None, trim_gap=0, max_requests=4, ctx_pages=8):
    cfg = Cfg(
        P=P,
        mode=mode,
        target_pages=target_pages,
        draft_pages=draft_pages,
        window=window or 2 * P,
        trim_gap=trim_gap,
        max_requests=max_requests,
        ctx_pages=ctx_pages,
    )
    mgr = make_mgr(cfg)
    mgr.open_session("s", model="m")
    return mgr


def draft_free(mgr):
    return mgr.draft.free_pages if mgr.draft is not None else mgr.target.free_pages


def assert_idle(mgr):
    """Nothing held: every page free exactly once, page 0 never on a free list, no mapping or row left."""
    check_structure(mgr)
    pools = [mgr.target] + ([mgr.draft] if mgr.draft is not None else [])
    for pool in pools:
        assert pool.free_pages == pool.num_pages
        assert sorted(pool._free) == list(range(1, pool.num_pages + 1))
    assert not mgr.mapping.any() and not mgr.req_to_token.any()
    assert mgr.held_tokens() == (0, 0)


@pytest.mark.parametrize("mode", [BOUNDED, IDENTITY])
def test_partial_page_release_clears_its_slots_but_keeps_the_page(mode):
    """#27779: releasing some tokens of a page unmaps exactly those slots; the page stays held."""
    P = 64
    mgr = mgr_for(P, mode)
    [a] = mgr.step("s", Release(), extends=[("r", 0, 70)])
    t, d = a.target_slots, a.draft_slots
    free_t, free_d = mgr.target.free_pages, draft_free(mgr)
    mgr.step("s", Release(commits=(("r", 66),)))
    assert (mgr.target.free_pages, draft_free(mgr)) == (free_t, free_d), "a partly released page was freed"
    assert not mgr.mapping[t[66:]].any() and not mgr.translate(t[66:]).any()
    assert np.array_equal(mgr.translate(t[:66]), d[:66])
    assert not mgr.req_to_token[a.row, 66:].any()
    check_structure(mgr)
    # releasing the rest of the page frees it, with no mapping left on any of its slots
    mgr.step("s", Release(commits=(("r", 64),)))
    page = int(t[64]) // P
    assert not mgr.mapping[page * P : (page + 1) * P].any()
    assert (mgr.target.free_pages, draft_free(mgr)) == (free_t + 1, free_d + 1)
    check_structure(mgr)
    mgr.step("s", Release(finishes=("r",)))
    assert_idle(mgr)


@pytest.mark.parametrize("mode", [BOUNDED, IDENTITY])
def test_recycled_page_is_clean(mode):
    """#25805: a page freed by a commit carries no stale mapping into its next owner; no double free later."""
    P = 64
    mgr = mgr_for(P, mode)
    [a] = mgr.step("s", Release(), extends=[("r1", 0, 2 * P + 2)])
    third = int(a.target_slots[2 * P]) // P
    mgr.step("s", Release(commits=(("r1", P + 36),)))  # frees the third page, keeps 36 of the second
    assert not mgr.mapping[third * P : (third + 1) * P].any()
    [b] = mgr.step("s", Release(), extends=[("r2", 0, 3)])
    assert int(b.target_slots[0]) // P == third, "expected the freed page to be handed out again"
    assert np.array_equal(mgr.translate(b.target_slots), b.draft_slots)
    assert not mgr.mapping[third * P + 3 : (third + 1) * P].any(), "stale mapping past the new owner's tail"
    [c] = mgr.step("s", Release(), grows=[("r1", 40)])  # re-grow r1 past where it was
    assert np.array_equal(c.target_slots[: P - 36], np.arange(P - 36) + int(a.target_slots[P + 36]))
    assert not set(c.target_slots.tolist()) & set(b.target_slots.tolist())
    assert np.array_equal(mgr.translate(c.target_slots), c.draft_slots)
    check_structure(mgr)
    mgr.step("s", Release(finishes=("r1",)))
    assert np.array_equal(mgr.translate(b.target_slots), b.draft_slots)
    mgr.step("s", Release(finishes=("r2",)))
    assert_idle(mgr)


@pytest.mark.parametrize("P", [1, 64])
@pytest.mark.parametrize("mode", [BOUNDED, IDENTITY])
def test_page_zero_never_enters_a_free_list(P, mode):
    """#38519: the sink page is never handed out nor freed, even after trims and a lost session."""
    mgr = mgr_for(P, mode, target_pages=6, draft_pages=6, ctx_pages=6, window=P)
    [a] = mgr.step("s", Release(), extends=[("r", 0, 6 * P)])
    assert (a.target_slots >= P).all() and (a.draft_slots >= P).all()
    assert mgr.target.free_pages == 0 and draft_free(mgr) == 0
    before = snapshot(mgr)
    with pytest.raises(ResourceExhausted):
        mgr.step("s", Release(), extends=[("q", 0, 1)])
    assert_unchanged(before, snapshot(mgr), "a failed allocation")
    mgr.step("s", Release(trims=("r",)))  # BOUNDED: draft pages below the frontier become 0 entries
    mgr.step("s", Release(finishes=("r",)))
    assert_idle(mgr)
    mgr.step("s", Release(), extends=[("x", 0, 3 * P), ("y", 0, 2 * P + 1)])
    mgr.step("s", Release(trims=("x", "y")))
    mgr.close_session("s")
    assert_idle(mgr)
    for bad in (0, P - 1):
        with pytest.raises(InvalidArgument):
            mgr.translate(np.asarray([bad]))
    with pytest.raises(InvariantViolation):
        PagePool(4, P, "draft").free([0])


@pytest.mark.parametrize("P", [1, 64])
def test_trim_never_frees_a_target_slot(P):
    mgr = mgr_for(P, target_pages=20, draft_pages=20, ctx_pages=20, window=2 * P)
    [a] = mgr.step("s", Release(), extends=[("r", 0, 8 * P + 5)])
    free_t, free_d = mgr.target.free_pages, mgr.draft.free_pages
    rows = mgr.req_to_token.copy()
    pages = list(mgr.sessions["s"]["r"].target_pages)
    t_freed, d_freed = mgr.apply_release("s", Release(trims=("r",)))
    frontier = (8 * P + 5 - 2 * P) // P * P
    assert t_freed == 0 and mgr.target.free_pages == free_t
    assert d_freed == frontier and mgr.draft.free_pages == free_d + frontier // P
    assert np.array_equal(mgr.req_to_token, rows) and mgr.sessions["s"]["r"].target_pages == pages
    assert not mgr.target._is_free[np.asarray(pages)].any()
    assert not mgr.translate(a.target_slots[:frontier]).any()
    assert np.array_equal(mgr.translate(a.target_slots[frontier:]), a.draft_slots[frontier:])
    check_structure(mgr)


@pytest.mark.parametrize("P", [1, 64])
def test_a_trim_counts_the_window_back_from_the_length_it_carries(P):
    """A client holding positions granted ahead trims from its computed length: draft slots still inside the window
    of the computed positions stay; a length past what the request holds is refused and changes nothing."""
    mgr = mgr_for(P, target_pages=20, draft_pages=20, ctx_pages=20, window=2 * P)
    [a] = mgr.step("s", Release(), extends=[("r", 0, 8 * P + 5)])
    computed = 5 * P + 1  # the rest is granted ahead
    before = snapshot(mgr)
    with pytest.raises(InvalidArgument):
        mgr.step("s", Release(trims=(("r", 8 * P + 6),)))
    assert_unchanged(before, snapshot(mgr), "a refused trim")
    _, d_freed = mgr.apply_release("s", Release(trims=(("r", computed),)))
    frontier = (computed - 2 * P) // P * P
    assert d_freed == frontier and mgr.sessions["s"]["r"].draft_start == frontier
    assert not mgr.translate(a.target_slots[:frontier]).any()
    assert np.array_equal(mgr.translate(a.target_slots[frontier:]), a.draft_slots[frontier:])
    _, d_freed = mgr.apply_release("s", Release(trims=(("r", computed - P),)))  # an older length: nothing more
    assert d_freed == 0
    check_structure(mgr)
    mgr.step("s", Release(finishes=("r",)))
    assert_idle(mgr)


@pytest.mark.parametrize("P", [1, 64])
@pytest.mark.parametrize(
    "ending", ["separate", "trim_and_finish", "commit_trim_finish", "close_session", "commit_to_frontier"]
)
def test_finishing_after_trims_frees_each_draft_page_once(P, ending):
    mgr = mgr_for(P, target_pages=20, draft_pages=20, ctx_pages=20, window=2 * P)
    mgr.step("s", Release(), extends=[("r", 0, 5 * P + 3)])
    mgr.step("s", Release(trims=("r",)))
    mgr.step("s", Release(), grows=[("r", 2 * P)])
    start = mgr.sessions["s"]["r"].length
    if ending == "separate":
        mgr.step("s", Release(trims=("r",)))
        mgr.step("s", Release(finishes=("r",)))
    elif ending == "trim_and_finish":
        mgr.step("s", Release(trims=("r",), finishes=("r",)))
    elif ending == "commit_trim_finish":
        mgr.step("s", Release(commits=(("r", start - 3),), trims=("r",), finishes=("r",)))
    elif ending == "close_session":
        mgr.step("s", Release(trims=("r",)))
        mgr.close_session("s")
    else:
        mgr.step("s", Release(trims=("r",)))
        ds = mgr.sessions["s"]["r"].draft_start
        mgr.step("s", Release(commits=(("r", ds),)))
        mgr.step("s", Release(), grows=[("r", 1)])
        mgr.step("s", Release(finishes=("r",)))
    assert_idle(mgr)


@pytest.mark.parametrize("P", [1, 64])
def test_steady_decode_keeps_the_draft_window_bounded(P):
    """#34924: with a trim every step, draft use stays at window + page + block, not linear in length."""
    block, window = 4, 2 * P
    mgr = mgr_for(P, target_pages=40, draft_pages=6, ctx_pages=40, window=window)
    mgr.step("s", Release(), extends=[("r", 0, 3 * P)])
    base = mgr.sessions["s"]["r"].length
    mgr.step("s", Release(trims=("r",)), grows=[("r", block)])
    for i in range(40 * P // block):
        keep = base + (i % (block + 1))
        if keep + block > 40 * P:
            break
        mgr.step("s", Release(commits=(("r", keep),), trims=("r",)), grows=[("r", block)])
        req = mgr.sessions["s"]["r"]
        base = keep
        assert req.length - req.draft_start <= window + P - 1 + block
        check_structure(mgr)
    assert mgr.sessions["s"]["r"].length > 10 * P
    mgr.step("s", Release(finishes=("r",)))
    assert_idle(mgr)


def test_exhaustion_counts_both_sides_and_the_release():
    """#29662: the draft side alone can be short; a release in the same step counts toward the need."""
    P = 64
    mgr = mgr_for(P, target_pages=12, draft_pages=5, ctx_pages=12, window=P)
    before = snapshot(mgr)
    with pytest.raises(ResourceExhausted, match="draft"):
        mgr.step("s", Release(), extends=[("big", 0, 6 * P)])
    assert_unchanged(before, snapshot(mgr), "a failed allocation")
    mgr.step("s", Release(), extends=[("r1", 0, 4 * P)])
    before = snapshot(mgr)
    with pytest.raises(ResourceExhausted, match="draft"):
        mgr.step("s", Release(), extends=[("r2", 0, 2 * P)])
    assert_unchanged(before, snapshot(mgr), "a failed allocation")
    [b] = mgr.step("s", Release(trims=("r1",)), extends=[("r2", 0, 2 * P)])  # the trim frees 3 draft pages
    assert mgr.sessions["s"]["r1"].draft_start == 3 * P
    check_structure(mgr)
    mgr.step("s", Release(finishes=("r1", "r2")), extends=[("r3", 0, 5 * P)])
    check_structure(mgr)
    mgr.close_session("s")
    assert_idle(mgr)
