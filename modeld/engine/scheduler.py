"""Continuous batching over memd's pools.

A step waits for memd (Alloc) at most once, and only when it must: to admit requests (their prefill chunks)
or to grow a decode that has no slot left. With a lookahead, a decode that needs slots is granted `lookahead`
more positions than it needs (the chunk that ends a prompt too), and a step that needs no call sends, without
waiting, once a decode runs short, the top-ups of the whole batch with the releases due (finished requests with
the tokens whose K/V they computed, for memd's prefix cache; prompt checkpoints; out-of-window draft trims, which
carry the computed length); memd answers while the step runs. So most steps wait for nothing (memd stays the only
allocator: the spare slots are the request's, freed with it or given back when memory is short, the "lean"
plan). A request is admitted from the usable cached prefix memd matches for it (MatchPrefix; a burst of
arrivals in one MatchPrefixBatch): only the rest is prefilled. An arrival whose prompt fits the step, with no
earlier admission of the step asking memd after it, asks memd to grant the prompt (and the lookahead) in that same
call, so that a lone arrival or a burst is admitted in one round trip.
With `alone_prompt_tokens` (modeld.engine.tuning: 128 by default with CUDA graphs, else off), a lone prompt chunk that
short runs in a step of its own while requests decode: it then replays a graph of one request instead
of an eager forward of the whole batch (mostly kernel launches for a small model), and the decodes wait that one
step; never two such steps in a row, so a stream of arrivals cannot hold them back.
When memd answers RESOURCE_EXHAUSTED nothing changed there, and the step is planned again: first without new
admissions and prefill chunks (they wait), then by preempting the newest running request (its slots are
released and it is recomputed later from its prompt and the tokens it already produced, so its greedy output
does not change).
"""

import logging
from collections import deque

import grpc

from memd.attach import MemdSession
from modeld.engine.hooks import EngineHooks
from modeld.engine.memd_calls import MEMD_GONE, MemdCalls
from modeld.engine.step_items import PlanItem, StepItem
from modeld.request import Finish, Request
from modeld.spec.policy import SpeculationPolicy

log = logging.getLogger("modeld")


class Scheduler:
    def __init__(
        self,
        session: MemdSession,
        max_running: int,
        chunk_tokens: int,
        context_len: int,
        block: int = 0,
        lookahead: int = 0,
        async_top_ups: bool = False,
        speculate_below: int = 0,
        policy: SpeculationPolicy | None = None,
        alone_prompt_tokens: int = 0,
        hooks: EngineHooks | None = None,
    ):
        self.max_running = max_running
        self.chunk_tokens = chunk_tokens
        self.context_len = context_len
        self.lookahead = lookahead  # decode positions granted beyond a step's need (0: exactly what it needs)
        self.block = block  # DFLASH block size: a decode verifies this many tokens; 0 without speculation
        self.speculate_below = speculate_below  # verify blocks only while fewer requests run (0: no cap)
        self.policy = policy  # below the cap, whether verifying pays this step (None: it always does)
        self.alone_prompt_tokens = alone_prompt_tokens  # a lone prompt chunk this short runs without the decodes
        self.alone_last = False  # the last step ran a prompt chunk alone while requests decoded
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # shared with self.memd: changed in place only
        self.memd = MemdCalls(session, self.running, lookahead, async_top_ups, hooks)
        self.left_out: dict[str, grpc.RpcError | None] = {}  # requests memd refused alone this step (None: no room)
        self.preemptions = 0

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def remove(self, req: Request) -> None:
        """A request is done (finished, aborted, failed): its slots go back on the next call, and the speculation
        policy forgets its acceptance."""
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.memd.release(req)
        if self.policy is not None:
            self.policy.forget(req)

    def set_limits(
        self, max_running: int, chunk_tokens: int, context_len: int, lookahead: int, async_top_ups: bool
    ) -> None:
        """memd's limits (again after a re-attach to a memd with other settings)."""
        self.max_running, self.chunk_tokens, self.context_len = max_running, chunk_tokens, context_len
        self.lookahead = lookahead
        self.memd.set_lookahead(lookahead, async_top_ups)

    def next_step(self) -> tuple[list[StepItem], list[Request]]:
        """The batch of this step, and requests that can never fit (to be failed).

        When memd refuses, the plan shrinks: first every spare slot goes back and nothing is
        granted ahead (lean), then fewer new admissions, then none (running requests only), then
        decodes only, then (DFLASH) single-token decodes instead of verify blocks, then waiting
        requests give their matches (locked prefixes) back and the running requests' prompt chunks are asked again;
        below that the newest running request is preempted. A request that cannot be admitted even alone into an
        idle pool can never run: it is failed."""
        hopeless: list[Request] = []
        memd = self.memd
        spec = self._speculating()  # asked once a step: the policy's answer costs a pass over the running requests
        memd.settle_in_flight(wait=self._may_call(spec) and not memd.behind_idle_releases())
        refused: set[tuple] = set()  # plans memd refused this step: a level that changes nothing is not asked again
        admit, level, lean = self.max_running, 0, not self.lookahead
        unmatched = False  # waiting requests' matches were given back this step (once: then the ladder goes on)
        while True:
            plan, admitted, alone = self._plan(level, admit, spec, lean)
            if plan:
                self.left_out = {}
                answer = self._ask(plan, refused, lean)
                if answer is not None:
                    plan, admitted = self._leave_out(plan, admitted, hopeless)
                    items = self._commit(plan, admitted, answer)
                    self.alone_last = alone
                    if not answer and memd.async_top_ups:
                        memd.top_up(items, self.context_len)
                    return items, hopeless
                self.waiting.extendleft(reversed(admitted))
            elif level == 0 or not self.running:
                return [], hopeless
            if not lean:
                lean = True
            elif level == 0 and len(admitted) > 1:
                admit = len(admitted) - 1
            elif level == 0 and admitted and not self.running and not unmatched and self._unmatch_waiting(admitted[0]):
                unmatched = True  # an admission alone into an idle pool: other waiting requests' locks go back first
            elif level == 0 and admitted and not self.running:
                hopeless.append(self._give_up(admitted[0]))
            elif level < 2:
                level += 1
            elif spec:
                spec = False
            elif self._unmatch_waiting():
                # waiting requests' locked prefixes go back first (evictable with this call): the running requests'
                # prompt chunks, dropped at level 2, are asked again with that room
                level = min(level, 1)
            elif len(self.running) > 1:
                self._preempt(self.running[-1])
            else:
                hopeless.append(self._give_up(self.running[0]))

    def _ask(self, plan: list[PlanItem], refused: set[tuple], lean: bool):
        """memd's answer to a plan ({} when the step needs no call), or None when it is (or was already) refused."""
        memd = self.memd
        extends = [(p.req.rid, p.req.held, p.ask) for p in plan if not p.decode and p.ask]
        grows = [(p.req.rid, p.ask) for p in plan if p.decode and p.ask]
        if not (extends or grows) and (memd.async_top_ups or not (memd.releases or memd.cache)):
            # every decode runs on slots granted ahead; releases go out without waiting, or with the next call
            return {}
        memd.settle_in_flight(wait=True)
        key = (tuple(extends), tuple(grows), tuple(memd.releases), lean)
        if key in refused:
            return None
        try:
            answer = memd.alloc(extends, grows, lean)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                refused.add(key)
                return None
            if exc.code() in MEMD_GONE:
                raise
            log.error("memd refused a step (%s: %s): its operations go one by one", exc.code().name, exc.details())
            memd.releases_one_by_one(lean)
            answers, left_out = memd.allocs_one_by_one(plan)
            self.left_out.update(left_out)
            return answers
        return {a.rid: a for a in answer.requests}

    def _may_call(self, spec: bool) -> bool:
        """Whether this step might wait for memd (then the call in flight must be answered first, unless it carries
        an idle pass's releases alone: MemdCalls.behind_idle_releases): an admission, a prefill chunk, a decode short of
        slots, or (without calls sent ahead) a pending release."""
        memd = self.memd
        releasing = bool(memd.releases or memd.cache) and not memd.async_top_ups
        return (
            bool(self.waiting)
            or releasing
            or any(r.pending > 1 or r.computed + self._decode_tokens(r, spec) > r.held for r in self.running)
        )

    def continues(self, items: list[StepItem]) -> bool:
        """Whether the step after these items (queued before they are committed: each request's computed position
        is the one they compute) would be the same batch one token further with no memd call due: nothing waits and
        nothing is to be released or cached, every running request is in it as a one-token decode (no DFLASH
        verify), and each holds the position that step computes with half the lookahead to spare (so a top-up goes
        out at its usual time, on a step of its own)."""
        if (
            self.waiting
            or self.memd.releases
            or self.memd.cache
            or not self.lookahead
            or len(items) != len(self.running)
            or self._speculating()
        ):
            return False
        return all(
            not item.verify
            and item.num_tokens == 1
            and item.req.pending == 1
            and item.req.held - (item.req.computed + 2) >= self.lookahead // 2
            for item in items
        )

    def _leave_out(self, plan, admitted, hopeless):
        """Drops from the step the requests memd refused alone: failed with memd's error, or (no room) waiting."""
        if not self.left_out:
            return plan, admitted
        for p in plan:
            r = p.req
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
        return [p for p in plan if p.req.rid not in self.left_out], admitted

    def _speculating(self) -> bool:
        """Decodes verify DFLASH blocks this step: with a draft, while fewer than `speculate_below` requests run (a
        hard cap), where the policy expects verifying to commit more tokens a second than plain decoding. Otherwise
        the batch decodes plainly, each token still written to the draft's context for when speculation resumes."""
        if not self.block or (self.speculate_below and len(self.running) >= self.speculate_below):
            return False
        return self.policy is None or self.policy.speculate(self.running)

    def _decode_tokens(self, r: Request, spec: bool) -> int:
        """A decode computes the last token; with DFLASH it verifies a whole block when it fits."""
        return self.block if spec and r.computed + self.block <= self.context_len else 1

    def _plan(self, level: int, admit: int, spec: bool, lean: bool) -> tuple[list[PlanItem], list[Request], bool]:
        """This step's plan, the requests newly admitted, and whether its one prompt chunk runs alone (the decodes
        wait): level 0 admits up to `admit` waiting requests, level 1 serves running requests only, level 2 decodes."""
        memd = self.memd
        decodes = [(r, self._decode_tokens(r, spec)) for r in self.running if r.pending == 1]
        plan = []
        if level < 2:
            budget = self.chunk_tokens
            for r in self.running:
                if r.pending > 1 and budget > 0:
                    take = min(r.pending, budget)
                    plan.append(PlanItem(r, take, False, self._extend_ask(r, take, lean)))
                    budget -= take
        admitted = []
        no_rows = level == 0 and self._match_ahead(min(admit, self.max_running - len(self.running)), budget, lean)
        while (
            level == 0
            and self.waiting
            and len(admitted) < admit
            and len(self.running) + len(admitted) < self.max_running
            and budget > 0
        ):
            if self.waiting[0].rid in memd.releases:
                break  # preempted this step: memd frees its old slots first
            first = self.waiting[0]
            if not first.in_memd:
                # Granted with its match only when no earlier admission of this step asks first (FIFO for memory).
                if no_rows or not memd.match(first, 0 if admitted else self._admission_end(first, budget, lean)):
                    break
            r = self.waiting.popleft()
            take = min(r.pending, budget)
            plan.append(PlanItem(r, take, False, self._extend_ask(r, take, lean)))
            admitted.append(r)
            budget -= take
        alone = bool(decodes) and self._runs_alone(plan)
        if alone:
            decodes = []  # they run the next step
        releasing = bool(memd.releases or memd.cache) and not memd.async_top_ups  # else they go out without waiting
        # memd is called anyway (so top-ups join): a plan item asks for positions (not those granted with a match)
        calling = lean or any(p.ask for p in plan) or releasing or any(r.computed + n > r.held for r, n in decodes)
        commits = memd.outgoing_commits(lean) if calling else {}
        grants = [
            PlanItem(r, n, True, self._grant(r, n, commits.get(r.rid, r.held), lean, calling)) for r, n in decodes
        ]
        return grants + plan, admitted, alone

    def _runs_alone(self, chunks: list[PlanItem]) -> bool:
        """Whether this step's prompt chunks are one short enough to run without the decodes (not twice in a row)."""
        return len(chunks) == 1 and chunks[0].num_tokens <= self.alone_prompt_tokens and not self.alone_last

    def _extend_ask(self, r: Request, take: int, lean: bool) -> int:
        """Positions to ask memd for, for a prefill chunk of `take` tokens, beyond those it holds (granted with its
        match): the chunk that ends the prompt also asks for the lookahead, so the decodes after it start on slots
        granted ahead."""
        end = r.computed + take
        if not (lean or not self.lookahead or take < r.pending):
            end = min(end + self.lookahead, self.context_len)
        return max(0, end - r.held)

    def _admission_end(self, r: Request, budget: int, lean: bool) -> int:
        """Where a lone arrival's first chunk ends when its whole prompt fits this step's budget (memd then grants it
        with the match); 0 (no grant with the match) otherwise. An unmatched request holds nothing (computed == held
        == 0), so that end is _extend_ask's ask for the whole prompt."""
        return self._extend_ask(r, r.pending, lean) if r.pending <= budget else 0

    def _match_ahead(self, count: int, budget: int, lean: bool) -> bool:
        """Registers in memd the waiting requests this step may admit (up to `count`) in one MatchPrefixBatch: one
        round trip and one call's work in memd for a burst of arrivals (on the CPU, 16 MatchPrefix calls in flight
        together took 4.0 ms, one batch of 16 0.85 ms: bench.memd.latency). All of them, not only those whose prompts
        fit the token budget: their cached prefixes are unknown until matched, and what is cached is not prefilled,
        so the admission loop may admit more than the whole prompts' budget says. The leading ones whose whole prompt
        fits the budget ask for their first chunk with the match (`_admission_end`), until the first that does not or
        a waiting request matched earlier (its chunk is asked for in the step's Alloc: FIFO for memory); when memd
        grants every one, the burst is admitted in that one round trip. Those memd has no row for stay unmatched;
        True when there were such (the admission loop then stops at the first, without asking memd again)."""
        picks, extending, releases = [], True, self.memd.releases
        for r in self.waiting:
            if len(picks) >= count or r.rid in releases:
                break
            if r.in_memd:
                extending = False
            else:
                end = self._admission_end(r, budget, lean) if extending else 0
                extending = end > 0
                picks.append((r, end))
            budget -= r.pending
        if len(picks) < 2:
            return False  # the admission loop matches a lone request itself
        return self.memd.match_batch(picks)

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

    def _unmatch_waiting(self, keep: Request | None = None) -> bool:
        """Matched requests still waiting (but `keep`) give their rows and locked prefixes back (on the next
        call): under memory pressure, before any running request is preempted. True if any did."""
        matched = [r for r in self.waiting if r.in_memd and r is not keep]
        for r in matched:
            self.memd.release(r)
            r.computed = 0
        return bool(matched)

    def _commit(self, plan: list[PlanItem], admitted: list[Request], answer: dict) -> list[StepItem]:
        for r in admitted:
            if not r.output_ids and not r.cached_tokens:
                r.cached_tokens = r.computed  # the prompt tokens served from the prefix cache
            self.running.append(r)
        items = []
        for p in plan:
            r, n, decode = p.req, p.num_tokens, p.decode
            got = answer.get(r.rid)
            if got is not None:  # slots of positions [got.start, got.start + p.ask); earlier spare slots stay
                kept = r.slots[r.computed - r.slots_from : got.start - r.slots_from] if decode else []
                r.slots, r.slots_from, r.row = kept + list(got.target_slots), r.computed, got.row
                r.held = got.start + len(got.target_slots)
            at = r.computed - r.slots_from
            items.append(StepItem(r, n, r.row, r.slots[at : at + n], verify=decode and n > 1))
        return items

    def _preempt(self, victim: Request) -> None:
        """Release the victim's slots; it is recomputed from its tokens when it is admitted again."""
        self.running.remove(victim)
        self.memd.release(victim)
        victim.computed = 0
        self.waiting.appendleft(victim)
        self.preemptions += 1
        log.info(
            "preempted %s after %d tokens to free KV (preemptions=%d)",
            victim.rid,
            len(victim.all_ids),
            self.preemptions,
        )

    def _give_up(self, req: Request) -> Request:
        """The pool cannot hold this request even alone."""
        req.finish = Finish(
            "abort",
            error_code="RESOURCE_EXHAUSTED",
            error=f"the request needs {req.computed + req.pending} tokens of KV and the pool cannot hold them",
        )
        self.remove(req)
        return req
