"""How the scheduler talks to memd besides planning: the step's Alloc, releases queued until a call carries them,
calls sent ahead without waiting and their answers, the MatchPrefix of waiting requests, and refused releases
reconciled one by one (one bad release never wedges the session)."""

import logging
from dataclasses import dataclass

import grpc

from memd.attach import MemdSession
from modeld.engine.hooks import EngineHooks
from modeld.engine.step_items import PlanItem, StepItem
from modeld.request import Request

log = logging.getLogger("modeld")
# memd is gone or not answering: the engine fails what runs and waits for it (nothing to reconcile step by step).
MEMD_GONE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)


@dataclass
class InFlight:
    """An Alloc sent without waiting: its future, and the releases it carries (sent again if memd refuses it)."""

    future: object
    finishes: list[str]
    cache: dict[str, list[int]]
    trims: dict[str, int]
    tops_up: bool  # it grants decode positions too (else it carries releases alone)


class MemdCalls:
    """A scheduler's memd session and what goes over it (modeld.engine.scheduler holds one)."""

    def __init__(
        self,
        session: MemdSession,
        running: list[Request],
        lookahead: int,
        async_top_ups: bool,
        hooks: EngineHooks | None = None,
    ):
        self.session = session
        self.hooks = hooks or EngineHooks()
        # The scheduler's running requests: its own list, changed in place and never rebound, so always current here.
        self.running = running
        self.set_lookahead(lookahead, async_top_ups)
        # a call memd has not answered yet; nothing else is sent meanwhile, except behind an idle pass's releases
        # (behind_idle_releases)
        self.in_flight: InFlight | None = None
        # Releases that ride on the next memd call: finished requests, verified lengths
        # (the uncommitted speculative tail goes back), and out-of-window draft trims.
        self.releases: list[str] = []
        self.cache: dict[str, list[int]] = {}  # computed tokens for memd's prefix cache: released or checkpointed
        self.commits: dict[str, int] = {}
        self.trims: dict[str, int] = {}  # rid -> the computed length its out-of-window draft trim counts from

    def set_lookahead(self, lookahead: int, async_top_ups: bool) -> None:
        self.lookahead = lookahead  # decode positions granted beyond a step's need (0: exactly what it needs)
        # Top-ups and releases sent without waiting, answered while the GPU runs the step.
        self.async_top_ups = async_top_ups and lookahead > 0

    def alloc(self, extends: list[tuple[str, int, int]], grows: list[tuple[str, int]], lean: bool):
        """One Alloc of a step's positions, carrying the releases due. A refusal (grpc.RpcError) changed nothing in
        memd and leaves the releases pending."""
        commits = self.outgoing_commits(lean)
        answer = self._observed(
            "memd alloc", self.session.alloc, extends=extends, grows=grows, **self._release_args(lean)
        )
        self._sent(commits)
        return answer

    def release(self, req: Request) -> None:
        """memd frees the request on the next call; the tokens whose K/V it computed go into the cache."""
        if req.in_memd:
            self.releases.append(req.rid)
            self.cache[req.rid] = req.all_ids[: req.computed]
            req.in_memd = False
        req.held, req.slots, req.slots_from = 0, [], 0
        self.commits.pop(req.rid, None)
        self.trims.pop(req.rid, None)

    def commit(self, req: Request, length: int) -> None:
        """After verification: memd keeps positions [0, length) of the request, frees the rest (with a lookahead the
        rest stays granted: the next steps' positions)."""
        if not self.lookahead:
            self.commits[req.rid] = length

    def checkpoint(self, req: Request) -> None:
        """Ask memd to cache a running request's computed tokens (its prompt, once prefilled): the
        prompt stays reusable, its draft window included, however long the generation runs."""
        if req.in_memd and req.rid not in self.releases:
            self.cache[req.rid] = req.all_ids[: req.computed]

    def trim(self, req: Request) -> None:
        """Ask memd to free the request's draft slots out of the window of its computed positions (a trim sent
        later, after more steps, frees less than it could: never a slot still in the window)."""
        self.trims[req.rid] = req.computed

    def outgoing_commits(self, lean: bool) -> dict[str, int]:
        """Commits this call sends. Without a lookahead every verified length goes out; with one, spare slots
        stay granted, except in a lean plan (memory is short: every spare goes back)."""
        if not self.lookahead:
            return dict(self.commits)
        if not lean:
            return {}
        return {r.rid: r.computed for r in self.running if r.in_memd and r.held > r.computed}

    def _release_args(self, lean: bool = True) -> dict:
        return dict(
            finishes=self.releases,
            commits=list(self.outgoing_commits(lean).items()),
            trims=sorted(self.trims.items()),
            cache=list(self.cache.items()),
        )

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
        self.settle_in_flight(wait=True)
        if self.releases or self.commits or self.trims:
            commits = self.outgoing_commits(lean=True)
            try:
                self._observed("memd free", self.session.free, **self._release_args(lean=True))
            except grpc.RpcError as exc:
                if exc.code() in MEMD_GONE:
                    raise
                log.error("memd refused the releases (%s: %s): they go one by one", exc.code().name, exc.details())
                self.releases_one_by_one(lean=True)
                return
            self._sent(commits)

    def release_idle(self) -> None:
        """A pass with no step: the releases go to memd now. With nothing running (the usual idle) they go in a call
        sent ahead, not waited for: the engine thread is free for the next arrival at once, and that arrival's
        MatchPrefix follows them on the same stream, so memd frees first. Running requests that got no step (memd
        had no room) give their spare slots back too, in a waited call (flush_releases)."""
        if self.running or not self.async_top_ups:
            self.flush_releases()
            return
        self.settle_in_flight(wait=True)
        if self.releases or self.cache:
            self.send_ahead([])

    def releases_one_by_one(self, lean: bool) -> None:
        """Sends each pending release on its own, in memd's order (commits, checkpoints, trims, finishes with
        their cache ops); one memd refuses (a request it no longer holds, say) is logged and dropped."""
        commits = self.outgoing_commits(lean)
        ops = [dict(commits=[(rid, n)]) for rid, n in commits.items()]
        ops += [dict(cache=[(rid, tokens)]) for rid, tokens in self.cache.items() if rid not in self.releases]
        ops += [dict(trims=[trim]) for trim in sorted(self.trims.items())]
        ops += [
            dict(finishes=[rid], cache=[(rid, self.cache[rid])] if rid in self.cache else []) for rid in self.releases
        ]
        for op in ops:
            try:
                self._observed("memd free", self.session.free, **op)
            except grpc.RpcError as exc:
                if exc.code() in MEMD_GONE:
                    raise
                log.error("memd refused %s (%s: %s): dropped", sorted(op), exc.code().name, exc.details())
        self._sent(commits)

    def allocs_one_by_one(self, plan: list[PlanItem]) -> tuple[dict, dict[str, grpc.RpcError | None]]:
        """Each request's allocation of a plan on its own (a request memd refuses fails alone, never the batch).
        Returns the answers by request id, and the requests left out: those memd refused outright (with its error)
        and those it has no room for (None), which sit this step out."""
        answers, left_out = {}, {}
        for p in plan:
            if not p.ask:
                continue  # runs on slots it holds
            r = p.req
            op = dict(grows=[(r.rid, p.ask)]) if p.decode else dict(extends=[(r.rid, r.held, p.ask)])
            try:
                answers.update({a.rid: a for a in self._observed("memd alloc", self.session.alloc, **op).requests})
            except grpc.RpcError as exc:
                if exc.code() in MEMD_GONE:
                    raise
                left_out[r.rid] = None if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED else exc
        return answers, left_out

    def top_up(self, items: list[StepItem], context_len: int) -> None:
        """After a step that needed no call, once a decode's spare is under half the lookahead or releases are
        pending (finishes, checkpoints; trims ride along): one Alloc, without waiting, with the releases and the
        top-ups of every item of the step not at its full lookahead. Topping up all of them aligns the requests of a
        batch, so that they come due together: one call every lookahead / 2 steps, not one a step for the few due
        (requests admitted a few at a time come due on different steps)."""
        if self.in_flight is not None:
            return
        grows, due = [], False
        for item in items:
            r, need = item.req, item.req.computed + item.num_tokens
            full = min(need + self.lookahead, context_len)
            if r.held < full:
                grows.append((r.rid, full - r.held))
                due = due or r.held - need < self.lookahead // 2
        if due or self.releases or self.cache:  # trims alone wait: a grant comes every lookahead / 2 positions
            self.send_ahead(grows)

    def send_ahead(self, grows: list[tuple[str, int]]) -> None:
        """One Alloc of these top-ups (rid, positions) with the releases due, without waiting: its answer is applied
        before the next step that needs it (or at once if it is there). Only while no call is in flight."""
        sent = InFlight(None, self.releases, self.cache, self.trims, tops_up=bool(grows))
        sent.future = self._observed(
            "memd send",
            self.session.alloc_async,
            grows=grows,
            trims=sorted(sent.trims.items()),
            finishes=sent.finishes,
            cache=list(sent.cache.items()),
        )
        self.in_flight = sent
        self.releases, self.cache, self.trims = [], {}, {}

    def behind_idle_releases(self) -> bool:
        """Whether a call sent now may go without waiting for the one in flight: nothing runs and that call carries
        releases alone (an idle pass's, release_idle). memd answers a session's calls in the order sent, over one
        stream, so it frees (and caches) first, and nothing this side needs the answer before; it is applied once
        there (a later call's answer implies it). A batch-1 arrival then waits for one round trip, not two."""
        return self.in_flight is not None and not self.in_flight.tops_up and not self.running

    def _await_answer(self, future):
        """memd's answer to a call sent ahead (the engine waits here only when a step needs it)."""
        return future.result() if future.done() else self._observed("memd answer", future.result)

    def _observed(self, phase: str, call, *args, **kwargs):
        """A call to memd (the engine thread waits for it, or for its sending alone), between the hooks' boundaries."""
        self.hooks.enter(phase)
        try:
            return call(*args, **kwargs)
        finally:
            self.hooks.leave(phase)

    def settle_in_flight(self, wait: bool) -> None:
        """Applies the call in flight once memd answered (waiting for it when `wait`). memd refused it: nothing
        changed there, its releases are pending again (and go one by one if memd refused for another reason than
        room), its top-ups are dropped (the next step that needs slots asks again, waiting)."""
        if self.in_flight is None or (not wait and not self.in_flight.future.done()):
            return
        sent, self.in_flight = self.in_flight, None
        try:
            answer = self._await_answer(sent.future)
        except grpc.RpcError as exc:
            running = {r.rid for r in self.running}
            self.releases[:0] = sent.finishes
            self.cache = {**sent.cache, **self.cache}  # a newer checkpoint of a running request wins
            self.trims = {**{rid: n for rid, n in sent.trims.items() if rid in running}, **self.trims}
            if exc.code() in MEMD_GONE:
                raise
            if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                log.error(
                    "memd refused a call sent ahead (%s: %s): its releases go one by one",
                    exc.code().name,
                    exc.details(),
                )
                self.releases_one_by_one(lean=True)
            return
        running = {r.rid: r for r in self.running}
        for got in answer.requests:
            r = running.get(got.rid)
            if r is None or not r.in_memd:  # finished or preempted since: its release frees the grant too
                continue
            r.slots = r.slots[r.computed - r.slots_from : got.start - r.slots_from] + list(got.target_slots)
            r.slots_from, r.held = r.computed, got.start + len(got.target_slots)

    def match(self, r: Request, extend_to: int = 0) -> bool:
        """Register a waiting request in memd at its usable cached prefix (the last token is always
        computed: its logits give the next one). It keeps that row and lock while it waits, until
        admitted or until memory pressure releases it. With `extend_to`, memd grants positions up to it in
        the same call when it has room (the request's first chunk: an admission in one round trip). False
        when memd has no request row free now."""
        try:
            answer = self._observed("memd match", self.session.match_prefix, r.rid, r.all_ids[:-1], extend_to=extend_to)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise
            return False
        self._matched(r, answer)
        return True

    @staticmethod
    def _matched(r: Request, answer) -> None:
        """A MatchPrefix answer applied: the request holds its row and [0, cached_len) in memd, and the positions of
        the extension when memd granted one with the match."""
        r.computed = r.held = answer.cached_len
        r.row, r.in_memd = answer.row, True
        if answer.HasField("extension"):
            got = answer.extension
            r.slots, r.slots_from, r.held = list(got.target_slots), got.start, got.start + len(got.target_slots)

    def match_batch(self, picks: list[tuple[Request, int]]) -> bool:
        """Registers waiting requests in memd in one MatchPrefixBatch, each (request, where the positions granted with
        its match end; 0: none). Those memd has no row for stay unmatched: True when there were such."""
        answers = self._observed(
            "memd match batch", self.session.match_prefix_batch, [(r.rid, r.all_ids[:-1], end) for r, end in picks]
        )
        for (r, _), answer in zip(picks, answers):
            self._matched(r, answer)
        return len(answers) < len(picks)
