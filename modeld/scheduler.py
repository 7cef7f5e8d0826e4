"""Continuous batching over memd's pools.

A step asks memd (Alloc) at most once for every request in the batch: decodes grow, prompts
are prefilled in chunks under a token budget, and the releases of requests that finished (or
were preempted) since the last call ride along, with the tokens whose K/V they computed, for
memd's prefix cache. With a lookahead, a decode that needs slots is granted `lookahead` more
positions than it needs, and once memd is called every decode running short is topped up, so
most decode steps need no memd call at all (memd stays the only allocator: the spare slots are
the request's, freed with it or given back by a commit). Spares are given back when memory is
short (the "lean" plan) and before an out-of-window draft trim (memd trims from the request's
length, which must then be the computed one). A request is admitted from the
usable cached prefix memd matches for it (MatchPrefix): only the rest is prefilled. When memd
answers RESOURCE_EXHAUSTED nothing changed there, and the step is planned again:
first without new admissions and prefill chunks (they wait), then by preempting the
newest running request (its slots are released and it is recomputed later from its
prompt and the tokens it already produced, so its greedy output does not change).
"""

import logging
from collections import deque
from dataclasses import dataclass

import grpc

from memd.attach import MemdSession
from modeld.request import Finish, Request

log = logging.getLogger("modeld")
# memd is gone or not answering: the engine fails what runs and waits for it (nothing to reconcile step by step).
MEMD_GONE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)


@dataclass
class StepItem:
    req: Request
    num_tokens: int
    row: int
    slots: list[int]  # target slots of the new positions
    verify: bool = False  # a DFLASH block: [last token, drafts] (the drafts are proposed on the device)


class Scheduler:
    def __init__(self, session: MemdSession, max_running: int, chunk_tokens: int, context_len: int, block: int = 0,
                 lookahead: int = 0, async_top_ups: bool = False):
        self.session = session
        self.lookahead = lookahead  # decode positions granted beyond a step's need (0: exactly what it needs)
        # Top-ups sent without waiting, answered while the GPU runs the step (not with draft trims: a trim commits
        # the request back to its computed length, which the steps run meanwhile would have passed).
        self.async_top_ups = async_top_ups and lookahead > 0
        self.in_flight = None  # (future, rids) of a top-up memd has not answered yet; nothing else is sent meanwhile
        self.max_running = max_running
        self.chunk_tokens = chunk_tokens
        self.context_len = context_len
        self.block = block  # DFLASH block size: a decode verifies this many tokens; 0 without speculation
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        # Releases that ride on the next memd call: finished requests, verified lengths
        # (the uncommitted speculative tail goes back), and out-of-window draft trims.
        self.releases: list[str] = []
        self.cache: dict[str, list[int]] = {}  # computed tokens for memd's prefix cache: released or checkpointed
        self.commits: dict[str, int] = {}
        self.trims: set[str] = set()
        self.left_out: dict[str, grpc.RpcError | None] = {}  # requests memd refused alone this step (None: no room)
        self.preemptions = 0

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def remove(self, req: Request) -> None:
        """A request is done (finished, aborted, failed): its slots go back on the next call."""
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self._release(req)

    def _release(self, req: Request) -> None:
        """memd frees the request on the next call; the tokens whose K/V it computed go into the cache."""
        if req.in_memd:
            self.releases.append(req.rid)
            self.cache[req.rid] = req.all_ids[: req.computed]
            req.in_memd = False
        req.held, req.slots, req.slots_from = 0, [], 0
        self.commits.pop(req.rid, None)
        self.trims.discard(req.rid)

    def commit(self, req: Request, length: int) -> None:
        """After verification: memd keeps positions [0, length) of the request, frees the rest."""
        self.commits[req.rid] = length

    def checkpoint(self, req: Request) -> None:
        """Ask memd to cache a running request's computed tokens (its prompt, once prefilled): the
        prompt stays reusable, its draft window included, however long the generation runs."""
        if req.in_memd and req.rid not in self.releases:
            self.cache[req.rid] = req.all_ids[: req.computed]

    def trim(self, req: Request) -> None:
        """Ask memd to free the request's out-of-window draft slots (with its spare slots given back first)."""
        self.trims.add(req.rid)
        if self.lookahead:
            self.commits[req.rid] = req.computed

    def _outgoing_commits(self, lean: bool) -> dict[str, int]:
        """Commits this call sends. Without a lookahead every verified length goes out; with one, spare slots
        stay granted, except before a trim and in a lean plan (memory is short: every spare goes back)."""
        if not self.lookahead:
            return dict(self.commits)
        out = {rid: n for rid, n in self.commits.items() if rid in self.trims}
        if lean:
            out.update({r.rid: r.computed for r in self.running if r.in_memd and r.held > r.computed})
        return out

    def _release_args(self, lean: bool = True) -> dict:
        return dict(finishes=self.releases, commits=list(self._outgoing_commits(lean).items()), trims=sorted(self.trims),
                    cache=list(self.cache.items()))

    def set_limits(self, max_running: int, chunk_tokens: int, context_len: int, lookahead: int, async_top_ups: bool) -> None:
        """memd's limits (again after a re-attach to a memd with other settings)."""
        self.max_running, self.chunk_tokens, self.context_len = max_running, chunk_tokens, context_len
        self.lookahead, self.async_top_ups = lookahead, async_top_ups and lookahead > 0

    def rebind(self, session: MemdSession) -> None:
        """A new memd session (re-attached): nothing of the old one is in flight any more."""
        self.session, self.in_flight = session, None

    def drop_releases(self) -> None:
        self.releases.clear()
        self.cache.clear()
        self.commits.clear()
        self.trims.clear()

    def _sent(self, commits: dict[str, int]) -> None:
        """A call carried the releases: requests committed back hold their computed length now."""
        for r in self.running:
            if r.rid in commits:
                r.held = commits[r.rid]
        self.drop_releases()

    def flush_releases(self) -> None:
        """Idle: nothing to batch the releases with, so free them now."""
        self._settle_top_up(wait=True)
        if self.releases or self.commits or self.trims:
            commits = self._outgoing_commits(lean=True)
            try:
                self.session.free(**self._release_args(lean=True))
            except grpc.RpcError as exc:
                if exc.code() in MEMD_GONE:
                    raise
                log.error("memd refused the releases (%s: %s): they go one by one", exc.code().name, exc.details())
                self._releases_one_by_one(lean=True)
                return
            self._sent(commits)

    def next_step(self) -> tuple[list[StepItem], list[Request]]:
        """The batch of this step, and requests that can never fit (to be failed).

        When memd refuses, the plan shrinks: first every spare slot goes back and nothing is
        granted ahead (lean), then fewer new admissions, then none (running requests only), then
        decodes only, then (DFLASH) single-token decodes instead of verify blocks; below that the
        newest running request is preempted. A request that cannot be admitted even alone into an
        idle pool can never run: it is failed."""
        hopeless: list[Request] = []
        self._settle_top_up(wait=self._may_call())
        refused: set[tuple] = set()  # plans memd refused this step: a level that changes nothing is not asked again
        admit, level, spec, lean = self.max_running, 0, bool(self.block), not self.lookahead
        while True:
            plan, admitted = self._plan(level, admit, spec, lean)
            if plan:
                self.left_out = {}
                answer = self._ask(plan, refused, lean)
                if answer is not None:
                    plan, admitted = self._leave_out(plan, admitted, hopeless)
                    items = self._commit(plan, admitted, answer)
                    if not answer and self.async_top_ups:
                        self._send_top_up(items)
                    return items, hopeless
                self.waiting.extendleft(reversed(admitted))
            elif level == 0 or not self.running:
                return [], hopeless
            if not lean:
                lean = True
            elif level == 0 and len(admitted) > 1:
                admit = len(admitted) - 1
            elif level == 0 and admitted and not self.running:
                hopeless.append(self._give_up(admitted[0]))
            elif level < 2:
                level += 1
            elif spec:
                spec = False
            elif self._unmatch_waiting():
                pass  # waiting requests' locked prefixes go back first (evictable on the next call)
            elif len(self.running) > 1:
                self._preempt(self.running[-1])
            else:
                hopeless.append(self._give_up(self.running[0]))

    def _ask(self, plan, refused: set[tuple], lean: bool):
        """memd's answer to a plan ({} when the step needs no call), or None when it is (or was already) refused."""
        extends = [(r.rid, r.computed, n) for r, n, decode, ask in plan if not decode]
        grows = [(r.rid, ask) for r, n, decode, ask in plan if decode and ask]
        if not (extends or grows or self.releases or self.cache):
            return {}  # every decode runs on slots granted ahead; commits and trims wait for the next call
        self._settle_top_up(wait=True)
        key = (tuple(extends), tuple(grows), tuple(self.releases), lean)
        if key in refused:
            return None
        commits = self._outgoing_commits(lean)
        try:
            answer = self.session.alloc(extends=extends, grows=grows, **self._release_args(lean))
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                refused.add(key)
                return None
            if exc.code() in MEMD_GONE:
                raise
            log.error("memd refused a step (%s: %s): its operations go one by one", exc.code().name, exc.details())
            self._releases_one_by_one(lean)
            return self._allocs_one_by_one(plan)
        self._sent(commits)
        return {a.rid: a for a in answer.requests}

    # ---- a refused step: find what memd refuses, drop or fail only that --------------------------------------
    def _releases_one_by_one(self, lean: bool) -> None:
        """Sends each pending release on its own, in memd's order (commits, checkpoints, trims, finishes with
        their cache ops); one memd refuses (a request it no longer holds, say) is logged and dropped."""
        commits = self._outgoing_commits(lean)
        ops = [dict(commits=[(rid, n)]) for rid, n in commits.items()]
        ops += [dict(cache=[(rid, tokens)]) for rid, tokens in self.cache.items() if rid not in self.releases]
        ops += [dict(trims=[rid]) for rid in sorted(self.trims)]
        ops += [dict(finishes=[rid], cache=[(rid, self.cache[rid])] if rid in self.cache else []) for rid in self.releases]
        for op in ops:
            try:
                self.session.free(**op)
            except grpc.RpcError as exc:
                if exc.code() in MEMD_GONE:
                    raise
                log.error("memd refused %s (%s: %s): dropped", sorted(op), exc.code().name, exc.details())
        self._sent(commits)

    def _allocs_one_by_one(self, plan) -> dict:
        """Each request's allocation on its own: the ones memd refuses outright fail (alone), the ones it has no
        room for sit this step out. Returns the answers; the rest of the plan is marked in `self.left_out`."""
        answer = {}
        for r, n, decode, ask in plan:
            op = dict(grows=[(r.rid, ask)]) if decode else dict(extends=[(r.rid, r.computed, n)])
            if decode and not ask:
                continue
            try:
                answer.update({a.rid: a for a in self.session.alloc(**op).requests})
            except grpc.RpcError as exc:
                if exc.code() in MEMD_GONE:
                    raise
                self.left_out[r.rid] = None if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED else exc
        return answer

    # ---- top-ups answered while the step runs --------------------------------------------------------------
    def _may_call(self) -> bool:
        """Whether this step might call memd (then an in-flight top-up must be answered first)."""
        spec = bool(self.block)
        return bool(self.waiting or self.releases or self.cache) or any(
            r.pending > 1 or r.computed + self._decode_tokens(r, spec) > r.held for r in self.running)

    def _send_top_up(self, items: list[StepItem]) -> None:
        """After a step that needed no call: grant ahead, without waiting, every decode whose spare is under half
        the lookahead. Its answer is applied before the next step that needs it (or at once if it is there)."""
        if self.in_flight is not None:
            return
        grows = []
        for item in items:
            r, need = item.req, item.req.computed + item.num_tokens
            if r.held - need < self.lookahead // 2 and r.held < self.context_len:
                grows.append((r.rid, min(need + self.lookahead, self.context_len) - r.held))
        if grows:
            self.in_flight = (self.session.grow_async(grows), {rid for rid, _ in grows})

    def _settle_top_up(self, wait: bool) -> None:
        """Applies the in-flight top-up's grants once memd answered (waiting for it when `wait`). A refusal
        changes nothing in memd and is dropped: the next step that needs slots asks again, waiting."""
        if self.in_flight is None or (not wait and not self.in_flight[0].done()):
            return
        future, _ = self.in_flight
        self.in_flight = None
        try:
            answer = future.result()
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise
            return
        running = {r.rid: r for r in self.running}
        for got in answer.requests:
            r = running.get(got.rid)
            if r is None or not r.in_memd:  # finished or preempted since: its release frees the grant too
                continue
            r.slots = r.slots[r.computed - r.slots_from : got.start - r.slots_from] + list(got.target_slots)
            r.slots_from, r.held = r.computed, got.start + len(got.target_slots)

    def _leave_out(self, plan, admitted, hopeless):
        """Drops from the step the requests memd refused alone: failed with memd's error, or (no room) waiting."""
        if not self.left_out:
            return plan, admitted
        for r, *_ in plan:
            if r.rid not in self.left_out:
                continue
            exc = self.left_out[r.rid]
            if exc is not None:
                r.finish = Finish("abort", error_code=exc.code().name, error=f"memd: {exc.details()}")
                self.remove(r)  # a new admission is in neither list: only its release is queued
                hopeless.append(r)
        back = [r for r in admitted if r.rid in self.left_out and self.left_out[r.rid] is None]
        self.waiting.extendleft(reversed(back))
        admitted = [r for r in admitted if r.rid not in self.left_out]
        return [p for p in plan if p[0].rid not in self.left_out], admitted

    def _decode_tokens(self, r: Request, spec: bool) -> int:
        """A decode computes the last token; with DFLASH it verifies a whole block when it fits."""
        return self.block if spec and r.computed + self.block <= self.context_len else 1

    def _plan(self, level: int, admit: int, spec: bool, lean: bool):
        """(request, tokens, is_decode, tokens to ask memd for) for this step, and the requests newly admitted:
        level 0 admits up to `admit` waiting requests, level 1 serves running requests only, level 2 decodes."""
        decodes = [(r, self._decode_tokens(r, spec)) for r in self.running if r.pending == 1]
        plan = []
        if level < 2:
            budget = self.chunk_tokens
            for r in self.running:
                if r.pending > 1 and budget > 0:
                    take = min(r.pending, budget)
                    plan.append((r, take, False, take))
                    budget -= take
        admitted = []
        while level == 0 and self.waiting and len(admitted) < admit and len(self.running) + len(admitted) < self.max_running and budget > 0:
            if self.waiting[0].rid in self.releases:
                break  # preempted this step: memd frees its old slots first
            if not self.waiting[0].in_memd and not self._match(self.waiting[0]):
                break
            r = self.waiting.popleft()
            take = min(r.pending, budget)
            plan.append((r, take, False, take))
            admitted.append(r)
            budget -= take
        calling = lean or bool(plan or self.releases or self.cache) or any(r.computed + n > r.held for r, n in decodes)
        commits = self._outgoing_commits(lean) if calling else {}
        return [(r, n, True, self._grant(r, n, commits.get(r.rid, r.held), lean, calling)) for r, n in decodes] + plan, admitted

    def _grant(self, r: Request, n: int, base: int, lean: bool, calling: bool) -> int:
        """Positions to ask memd for, for a decode of n tokens of a request memd holds `base` positions of
        (after this call's commits): what it lacks plus the lookahead; when memd is called anyway, a top-up
        of a decode whose spare has fallen under half the lookahead; nothing beyond need when lean."""
        need = r.computed + n
        full = min(need + self.lookahead, self.context_len)
        if lean or not self.lookahead:
            return max(0, need - base)
        if need > base or (calling and base - need < self.lookahead // 2):
            return max(0, full - base)
        return 0

    def _match(self, r: Request) -> bool:
        """Register a waiting request in memd at its usable cached prefix (the last token is always
        computed: its logits give the next one). It keeps that row and lock while it waits, until
        admitted or until memory pressure releases it. False when memd has no request row free now."""
        try:
            answer = self.session.match_prefix(r.rid, r.all_ids[:-1])
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise
            return False
        r.computed = r.held = answer.cached_len
        r.row, r.in_memd = answer.row, True
        return True

    def _unmatch_waiting(self) -> bool:
        """Matched requests still waiting give their rows and locked prefixes back (on the next
        call): under memory pressure, before any running request is preempted. True if any did."""
        matched = [r for r in self.waiting if r.in_memd]
        for r in matched:
            self._release(r)
            r.computed = 0
        return bool(matched)

    def _commit(self, plan, admitted, answer) -> list[StepItem]:
        for r in admitted:
            if not r.output_ids and not r.cached_tokens:
                r.cached_tokens = r.computed  # the prompt tokens served from the prefix cache
            self.running.append(r)
        items = []
        for r, n, decode, ask in plan:
            got = answer.get(r.rid)
            if got is not None:  # slots of positions [got.start, got.start + ask); earlier spare slots stay
                kept = r.slots[r.computed - r.slots_from : got.start - r.slots_from] if decode else []
                r.slots, r.slots_from, r.row = kept + list(got.target_slots), r.computed, got.row
                r.held = got.start + len(got.target_slots)
            at = r.computed - r.slots_from
            items.append(StepItem(r, n, r.row, r.slots[at : at + n], verify=decode and n > 1))
        return items

    def _preempt(self, victim: Request) -> None:
        """Release the victim's slots; it is recomputed from its tokens when it is admitted again."""
        self.running.remove(victim)
        self._release(victim)
        victim.computed = 0
        self.waiting.appendleft(victim)
        self.preemptions += 1
        log.info("preempted %s after %d tokens to free KV (preemptions=%d)", victim.rid, len(victim.all_ids), self.preemptions)

    def _give_up(self, req: Request) -> Request:
        """The pool cannot hold this request even alone."""
        req.finish = Finish("abort", error_code="RESOURCE_EXHAUSTED",
                            error=f"the request needs {req.computed + req.pending} tokens of KV and the pool cannot hold them")
        self.remove(req)
        return req
