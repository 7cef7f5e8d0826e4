"""Two-sided slot allocation: target pages, draft pages, the target->draft mapping and
the per-request slot table (req_to_token), for whole scheduler steps.

Positions of a request live in pages: position p sits at page `pages[p // P]`, offset
`p % P`, on both sides, so a token's in-page offset is the same in the target and draft
pools. The mapping is nonzero exactly at target slots that hold a live draft slot (a
running request's window, or a cached page whose draft KV is live); every other entry
(free slots, released tails, trimmed positions, tombstones) is 0.

Model identity: every session names the model whose KV it writes (open_session's `model`);
its requests match and cache prefixes in that model's tree only. A session without one ("")
gets no prefix cache: it matches nothing and caches nothing.

Ownership: a request created by match_prefix starts with `cached_pages` pages that the
prefix cache owns (and the request only holds locked); every later page is the request's
own until it finishes, when it goes into the cache (insert) or back to the pools.
"""

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable

import numpy as np

from memd.errors import FailedPrecondition, InvalidArgument, InvariantViolation, NotFound, ResourceExhausted
from memd.metrics import EVICTED_TOKENS
from memd.pages import PagePool
from memd.prefix_cache import PrefixCache


class DraftMode(Enum):
    NONE = "none"  # plain decoding: no draft pool
    IDENTITY = "identity"  # ratio 1: draft slot == target slot
    BOUNDED = "bounded"  # ratio < 1: draft pages of their own, trimmed out of window


@dataclass
class Request:
    rid: str
    session: str
    row: int
    target_pages: list[int] = field(default_factory=list)
    draft_pages: list[int] = field(default_factory=list)  # BOUNDED only; 0 below draft_start
    length: int = 0  # positions [0, length) hold target slots
    draft_start: int = 0  # positions [draft_start, length) hold draft slots (page aligned)
    cached_pages: int = 0  # pages [0, cached_pages) belong to the prefix cache (matched, locked)
    locked: bool = False  # holds a lock in the prefix cache (matched or checkpointed)
    prefix: tuple[int, ...] = ()  # the tokens of the cached pages

    @property
    def holder(self) -> tuple[str, str]:
        return self.session, self.rid


@dataclass(frozen=True)
class Release:
    commits: tuple[tuple[str, int], ...] = ()
    # Out-of-window draft trims: a rid (the window counted back from the request's length after the commits) or
    # (rid, length) (from the client's computed length, at most that; positions granted ahead are not computed).
    trims: tuple[str | tuple[str, int], ...] = ()
    finishes: tuple[str, ...] = ()
    inserts: tuple[tuple[str, tuple[int, ...]], ...] = ()  # finished requests' tokens for the prefix cache

    def trim_lengths(self) -> dict[str, int | None]:
        """rid -> the length its trim counts from (None: the request's own)."""
        return dict((t, None) if isinstance(t, str) else t for t in self.trims)


@dataclass(frozen=True)
class Matched:
    rid: str
    row: int
    cached_len: int
    target_slots: np.ndarray
    draft_slots: np.ndarray
    extension: "Allocated | None" = None  # positions [cached_len, extend_to) granted in the same call


@dataclass(frozen=True)
class Allocated:
    rid: str
    row: int
    start: int
    target_slots: np.ndarray
    draft_slots: np.ndarray


WriteHook = Callable[[str, np.ndarray, np.ndarray], None]


class SlotManager:
    def __init__(
        self,
        *,
        target_pages: int,
        draft_pages: int,
        page_size: int,
        mode: DraftMode,
        window: int,
        trim_gap: int,
        max_requests: int,
        context_len: int,
        mapping: np.ndarray | None,
        req_to_token: np.ndarray,
        on_write: WriteHook | None = None,
    ):
        self.P = page_size
        self.mode = mode
        self.window = window
        self.trim_gap = trim_gap  # out-of-window frees wait until this many tokens are due
        self.context_len = context_len
        self.target = PagePool(target_pages, page_size, "target")
        self.draft = PagePool(draft_pages, page_size, "draft") if mode is DraftMode.BOUNDED else None
        self.mapping = mapping  # int32[(target_pages + 1) * P]
        self.req_to_token = req_to_token  # int32[max_requests + 1, context_len]; row 0 unused
        self.on_write = on_write or (lambda name, idx, values: None)
        self.free_rows = list(range(max_requests, 0, -1))
        self.max_requests = max_requests
        self.sessions: dict[str, dict[str, Request]] = {}
        self.writes_draft: dict[str, bool] = {}  # per session: does the client write draft KV?
        self.models: dict[str, str] = {}  # per session: its model identity ("": no prefix cache)
        self.cache = PrefixCache(page_size, self.target, self.draft, window, self._set_mapping)

    # ---- sessions ------------------------------------------------------------------
    def open_session(self, session: str, *, model: str, writes_draft: bool = True) -> None:
        if session in self.sessions:
            raise InvalidArgument(f"session {session!r} is already open")
        self.sessions[session] = {}
        self.writes_draft[session] = writes_draft
        self.models[session] = model

    def close_session(self, session: str) -> None:
        """The lease ended: free every request the session held (nothing goes into the cache:
        a lost client's KV may be half written)."""
        for rid in list(self.sessions.get(session, {})):
            self._finish(self.sessions[session][rid], None)
        self.sessions.pop(session, None)
        self.writes_draft.pop(session, None)
        self.models.pop(session, None)

    # ---- prefix cache ----------------------------------------------------------------
    def match_prefix(self, session: str, rid: str, tokens, extend_to: int = 0) -> Matched:
        """Register request `rid` at the usable cached prefix of `tokens` and lock it there; with `extend_to` past the
        match, also extend it to [cached_len, extend_to) if there is room (else the match stands alone: an admission
        is one call either way, and a refused extension changes nothing but the match)."""
        self._check_extend_to(extend_to)
        return self._extend_in_order(session, [(self._match(session, rid, tokens), extend_to)])[0]

    def match_prefix_batch(self, session: str, items: list[tuple[str, list[int], int]]) -> list[Matched]:
        """match_prefix for each (rid, tokens, extend_to), in order, in one call: every item is checked before
        anything changes (a bad one refuses the call); the first item no request row is free for ends the batch (it
        and the items after it stay unmatched, unchanged). The extensions follow the matches, in order: from the
        first one there is no room for, no later item of the call is extended (an arrival never takes the pages an
        earlier one could not get). Returns the leading items' matches."""
        held = self._requests(session)
        rids = [rid for rid, _, _ in items]
        if len(set(rids)) != len(rids):
            raise InvalidArgument("a request id appears more than once in one MatchPrefixBatch")
        for rid, tokens, extend_to in items:
            self._check_match(held, rid, tokens)
            self._check_extend_to(extend_to)
        matched = []
        for rid, tokens, extend_to in items:
            if not self.free_rows:
                break
            matched.append((self._match(session, rid, tokens), extend_to))
        return self._extend_in_order(session, matched)

    def _check_extend_to(self, extend_to: int) -> None:
        if not 0 <= extend_to <= self.context_len:
            raise InvalidArgument(f"extend_to {extend_to} must lie in [0, {self.context_len}] (the context)")

    def _extend_in_order(self, session: str, matched: list[tuple[Matched, int]]) -> list[Matched]:
        """Each (match, extend_to) extended to [cached_len, extend_to) where that lies past the match: all in one step
        when there is room for all, else one by one in order up to the first there is no room for (a refused step
        changes nothing, so the matches stand alone from there on)."""
        asks = [(m.rid, m.cached_len, end - m.cached_len) for m, end in matched if end > m.cached_len]
        if not asks:
            return [m for m, _ in matched]
        try:
            granted = self.step(session, Release(), extends=asks)
        except ResourceExhausted:  # one by one, in order (a refused step changes nothing: asking again is safe)
            granted = []
            for ask in asks:
                try:
                    granted += self.step(session, Release(), extends=[ask])
                except ResourceExhausted:
                    break
        extension = {a.rid: a for a in granted}
        return [dataclasses.replace(m, extension=extension[m.rid]) if m.rid in extension else m for m, _ in matched]

    def _check_match(self, held: dict, rid: str, tokens) -> None:
        if not rid:
            raise InvalidArgument("empty request id")
        if rid in held:
            raise InvalidArgument(f"request {rid!r} is already held by this session")
        if any(t < 0 for t in tokens):
            raise InvalidArgument("token ids must be >= 0")
        if len(tokens) > self.context_len:
            raise InvalidArgument(f"{len(tokens)} tokens exceed the context of {self.context_len}")

    def _match(self, session: str, rid: str, tokens) -> Matched:
        held = self._requests(session)
        self._check_match(held, rid, tokens)
        if not self.free_rows:
            raise ResourceExhausted(f"all {self.max_requests} request rows are in use")
        needs_draft = self.mode is DraftMode.BOUNDED and self.writes_draft[session]
        model = self.models[session]
        match = self.cache.match(model, tokens if model else [], needs_draft)
        draft_start = 0 if self.mode is DraftMode.IDENTITY else match.draft_from * self.P
        req = held[rid] = Request(
            rid,
            session,
            self.free_rows.pop(),
            list(match.target_pages),
            list(match.draft_pages),
            match.pages * self.P,
            draft_start,
            cached_pages=match.pages,
            locked=True,
            prefix=tuple(tokens[: match.pages * self.P]),
        )
        self.cache.lock(req.holder, match)
        positions = np.arange(req.length)
        target = self._slots(req.target_pages, positions)
        self._write("req_to_token", req.row * self.req_to_token.shape[1] + positions, target)
        draft = np.zeros_like(target)
        if self.mapping is not None:
            draft[req.draft_start :] = self.mapping[target[req.draft_start :]]
        return Matched(rid, req.row, req.length, target, draft)

    def flush_cache(self) -> tuple[int, int]:
        """Empty the prefix cache; only when no request runs. Returns tokens freed per side."""
        running = sum(1 for _ in self.requests())
        if running:
            raise FailedPrecondition(f"cannot flush the prefix cache while {running} requests run")
        before = (self.target.free_tokens, self._draft_free_tokens())
        self.cache.flush()
        return self.target.free_tokens - before[0], self._draft_free_tokens() - before[1]

    def cache_counts(self) -> tuple[int, int, int, int]:
        """(target evictable, target protected, draft evictable, draft protected) in tokens."""
        c, P = self.cache, self.P
        if self.mode is DraftMode.BOUNDED:
            draft = (c.evictable_d * P, c.protected_d * P)
        elif self.mode is DraftMode.IDENTITY:
            draft = (c.evictable_t * P, c.protected_t * P)
        else:
            draft = (0, 0)
        return c.evictable_t * P, c.protected_t * P, *draft

    def _set_mapping(self, target_pages: list[int], draft_pages: list[int] | None) -> None:
        """Whole pages of the mapping: target page -> draft page, or cleared."""
        if draft_pages is None:
            self._clear_mapping(np.empty(0, np.int32), target_pages)
        elif self.mapping is not None:
            self._write(
                "target_to_draft", self._page_slots(target_pages), self._page_slots(draft_pages).astype(np.int32)
            )

    def _requests(self, session: str) -> dict[str, Request]:
        if session not in self.sessions:
            raise NotFound(f"unknown session {session!r}")
        return self.sessions[session]

    # ---- page arithmetic (pure) -----------------------------------------------------
    def _pages_for(self, length: int) -> int:
        return -(-length // self.P)

    def _trim_frontier(self, length: int, draft_start: int) -> int:
        """First position to keep draft KV for: page aligned, keeping the last `window`."""
        if self.mode is not DraftMode.BOUNDED:
            return draft_start
        frontier = max(0, length - self.window) // self.P * self.P
        if frontier - draft_start < max(self.trim_gap, 1):
            return draft_start
        return frontier

    # ---- one scheduler step ---------------------------------------------------------
    def step(self, session: str, release: Release, extends=(), grows=()) -> list[Allocated]:
        """Releases, then allocations; if any allocation cannot be met nothing changes."""
        held = self._requests(session)
        after = self._plan_release(held, release)
        new_rows, need = self._plan_allocs(held, after, extends, grows)
        freed_t, freed_d, freed_rows = self._freed(held, after, release)
        # Pages the cache can give back: evictable now, plus what the finishes unlock, what trims whose window
        # leaves a cached prefix stop protecting, and the draft KV that checkpoints stop protecting (a checkpoint
        # unlocks and locks again, its window from the request's draft start on: pages of its old lock that the
        # window has left turn evictable). Requests locked before this call.
        finishing = {held[rid].holder for rid in release.finishes if held[rid].locked}
        checkpoints = [
            (rid, tokens)
            for rid, tokens in release.inserts
            if after.get(rid) is not None and after[rid][2] > held[rid].cached_pages
        ]
        leaving = {
            held[rid].holder
            for rid in release.trim_lengths()
            if held[rid].locked
            and after[rid] is not None
            and after[rid][1] >= after[rid][2] * self.P
            and after[rid][2] == held[rid].cached_pages
        }
        leaving |= {held[rid].holder for rid, _ in checkpoints if held[rid].locked}
        unlocked_t, unlocked_d = self.cache.released_by(finishing, leaving)
        # ... less what checkpoints lock: cached pages that nothing else will protect after this call.
        for rid, tokens in checkpoints:
            locked_t, locked_d = self.cache.newly_protected(
                self.models[session],
                tokens,
                after[rid][2],
                held[rid].draft_start // self.P,
                finishing,
                finishing | leaving,
            )
            unlocked_t, unlocked_d = unlocked_t - locked_t, unlocked_d - locked_d
        avail_t = self.target.free_pages + freed_t + self.cache.evictable_t + unlocked_t
        short = []
        if need > avail_t:
            short.append(f"target needs {need * self.P} tokens, {avail_t * self.P} free or evictable")
        if self.draft is not None:
            avail_d = self.draft.free_pages + freed_d + self.cache.evictable_d + unlocked_d
            if need > avail_d:
                short.append(f"draft needs {need * self.P} tokens, {avail_d * self.P} free or evictable")
        if new_rows > len(self.free_rows) + freed_rows:
            short.append(f"{new_rows} new requests, {len(self.free_rows) + freed_rows} request rows free")
        if short:
            raise ResourceExhausted("; ".join(short))
        self._apply_release(held, release)
        self._make_room(need)
        out = [self._extend(session, rid, n) for rid, _, n in extends]
        return out + [self._extend(session, rid, n) for rid, n in grows]

    def _make_room(self, need: int) -> None:
        """Evict from the cache until `need` pages are free on each side: target first (which frees
        the evicted nodes' draft KV too), then draft KV alone. step() checked that it suffices."""
        if need > self.target.free_pages:
            EVICTED_TOKENS.labels("target").inc(self.P * self.cache.evict_target(need - self.target.free_pages))
        if self.draft is not None and need > self.draft.free_pages:
            EVICTED_TOKENS.labels("draft").inc(self.P * self.cache.evict_draft(need - self.draft.free_pages))
        if need > self.target.free_pages or (self.draft is not None and need > self.draft.free_pages):
            raise InvariantViolation(f"eviction fell short of {need} pages (accounting of evictable pages is wrong)")

    def apply_release(self, session: str, release: Release) -> tuple[int, int]:
        """Commits, then out-of-window trims, then finishes. Returns tokens freed per side."""
        held = self._requests(session)
        self._plan_release(held, release)
        return self._apply_release(held, release)

    def _apply_release(self, held: dict[str, Request], release: Release) -> tuple[int, int]:
        """The mutations of a release that _plan_release has validated."""
        before = (self.target.free_tokens, self._draft_free_tokens())
        for rid, length in release.commits:
            self._commit(held[rid], length)
        inserts, finishing = dict(release.inserts), set(release.finishes)
        for rid, tokens in release.inserts:
            if rid not in finishing:
                self._checkpoint(held[rid], tokens)
        for rid, trim_length in release.trim_lengths().items():
            self._trim(held[rid], trim_length)
        for rid in release.finishes:
            self._finish(held[rid], inserts.get(rid))
        return self.target.free_tokens - before[0], self._draft_free_tokens() - before[1]

    def _plan_release(self, held: dict[str, Request], release: Release) -> dict[str, tuple[int, int, int] | None]:
        """Validates the release; returns rid -> (length, draft_start, cached pages) after it (None: finished).
        Order: commits, cache ops of running requests (checkpoints), trims, finishes."""
        after = {}
        trims = [t if isinstance(t, str) else t[0] for t in release.trims]  # duplicates counted before the dict
        for kind, rids in (("commit", [r for r, _ in release.commits]), ("trim", trims), ("finish", release.finishes)):
            if len(set(rids)) != len(rids):
                raise InvalidArgument(f"a request appears twice in {kind}")
            for rid in rids:
                if rid not in held:
                    raise NotFound(f"request {rid!r} is not held by this session")
        for rid, length in release.commits:
            req = held[rid]
            low = max(req.draft_start, req.cached_pages * self.P)
            if not low <= length <= req.length:
                raise InvalidArgument(f"commit of {rid!r} to length {length}: must lie in [{low}, {req.length}]")
            after[rid] = (length, req.draft_start, req.cached_pages)
        finishing = set(release.finishes)
        if len({rid for rid, _ in release.inserts}) != len(release.inserts):
            raise InvalidArgument("a request appears twice in cache")
        for rid, tokens in release.inserts:
            if rid not in held:
                raise NotFound(f"request {rid!r} is not held by this session")
            req = held[rid]
            length, start, cached = after.get(rid, (req.length, req.draft_start, req.cached_pages))
            if len(tokens) > length:
                raise InvalidArgument(
                    f"request {rid!r}: {len(tokens)} tokens to cache, but it holds {length} positions"
                )
            if any(t < 0 for t in tokens):
                raise InvalidArgument(f"request {rid!r}: token ids must be >= 0")
            if len(tokens) > len(req.prefix) and tuple(tokens[: len(req.prefix)]) != req.prefix:
                raise InvalidArgument(f"request {rid!r}: the tokens to cache disagree with its cached prefix")
            if rid not in finishing and self._checkpoints(req):
                after[rid] = (length, start, max(cached, len(tokens) // self.P))
        for rid, trim_length in release.trim_lengths().items():
            req = held[rid]
            length, start, cached = after.get(rid, (req.length, req.draft_start, req.cached_pages))
            if trim_length is not None and not 0 <= trim_length <= length:
                raise InvalidArgument(f"trim of {rid!r} from length {trim_length}: must lie in [0, {length}]")
            after[rid] = (length, self._trim_frontier(length if trim_length is None else trim_length, start), cached)
        for rid in release.finishes:
            after[rid] = None
        return after

    def _freed(self, held, after, release) -> tuple[int, int, int]:
        """Pages each side gets back from the release, and request rows."""
        freed_t = freed_d = 0
        inserts = dict(release.inserts)
        for rid, state in after.items():
            req = held[rid]
            if state is None:  # every own page goes back to the pools or into the cache (evictable)
                freed_t += len(req.target_pages) - req.cached_pages
                freed_d += len(req.target_pages) - self._own_draft_from(req)
                continue
            # A checkpoint turns own pages into cached (protected) ones and frees those the cache held
            # already; the trim after it frees only what is still the request's own.
            length, start, cached = state
            if cached > req.cached_pages:
                dup_t, dup_d = self.cache.duplicates(
                    self.models[req.session],
                    inserts[rid],
                    req.cached_pages,
                    cached,
                    req.draft_pages if self.draft is not None else [],
                )
                freed_t, freed_d = freed_t + dup_t, freed_d + (dup_d if self.draft is not None else dup_t)
            own_from = max(req.draft_start // self.P, cached)
            freed_t += len(req.target_pages) - self._pages_for(length)
            freed_d += len(req.target_pages) - self._pages_for(length) + max(0, start // self.P - own_from)
        return freed_t, freed_d, len(release.finishes)

    def _checkpoints(self, req: Request) -> bool:
        """A running request's cache op takes effect only for a session with a model identity, and only
        where its draft KV (if any) is valid."""
        return bool(self.models[req.session]) and (self.mode is DraftMode.NONE or self.writes_draft[req.session])

    def _own_draft_from(self, req: Request) -> int:
        """First page of the request's own live draft KV (earlier live ones belong to the cache)."""
        return max(req.draft_start // self.P, req.cached_pages)

    def _plan_allocs(self, held, after, extends, grows) -> tuple[int, int]:
        """Validates allocations; returns (new requests, pages needed per side)."""
        seen, new_rows, need = set(), 0, 0
        for rid, prefix_len, n in extends:
            self._check_alloc_rid(rid, seen, after, n)
            state = after.get(rid) or ((held[rid].length, 0) if rid in held else None)
            if state is None:
                if prefix_len != 0:
                    raise FailedPrecondition(
                        f"request {rid!r} is new: prefill starts at 0 (MatchPrefix starts a request from a cached "
                        "prefix)"
                    )
                new_rows += 1
                length = 0
            else:
                length = state[0]
                if prefix_len != length:
                    raise InvalidArgument(
                        f"extend of {rid!r} at prefix_len {prefix_len}, but it holds {length} positions"
                    )
            need += self._need(rid, length, n)
        for rid, n in grows:
            self._check_alloc_rid(rid, seen, after, n)
            if rid not in held:
                raise NotFound(f"request {rid!r} is not held by this session")
            need += self._need(rid, after.get(rid, (held[rid].length,))[0], n)
        return new_rows, need

    def _check_alloc_rid(self, rid, seen, after, n) -> None:
        if not rid:
            raise InvalidArgument("empty request id")
        if rid in seen:
            raise InvalidArgument(f"request {rid!r} is allocated twice in one call")
        if rid in after and after[rid] is None:
            raise InvalidArgument(f"request {rid!r} is finished and allocated in one call")
        if n < 1:
            raise InvalidArgument(f"request {rid!r}: num_tokens must be >= 1, got {n}")
        seen.add(rid)

    def _need(self, rid: str, length: int, n: int) -> int:
        if length + n > self.context_len:
            raise InvalidArgument(
                f"request {rid!r} would reach {length + n} tokens, beyond the context of {self.context_len}"
            )
        return self._pages_for(length + n) - self._pages_for(length)

    # ---- mutations --------------------------------------------------------------------
    def _extend(self, session: str, rid: str, n: int) -> Allocated:
        held = self.sessions[session]
        req = held.get(rid)
        if req is None:
            req = held[rid] = Request(rid, session, self.free_rows.pop())
        start = req.length
        count = self._pages_for(start + n) - self._pages_for(start)
        req.target_pages += self.target.alloc(count)
        if self.draft is not None:
            req.draft_pages += self.draft.alloc(count)
        req.length = start + n
        positions = np.arange(start, start + n)
        target = self._slots(req.target_pages, positions)
        draft = self._draft_slots(req, positions, target)
        self._write("req_to_token", req.row * self.req_to_token.shape[1] + positions, target)
        if self.mapping is not None:
            self._write("target_to_draft", target, draft)
        return Allocated(rid, req.row, start, target, draft)

    def _commit(self, req: Request, length: int) -> None:
        """Release positions [length, req.length): the uncommitted speculative tail."""
        if length == req.length:
            return
        keep = self._pages_for(length)
        positions = np.arange(length, req.length)
        target = self._slots(req.target_pages, positions)
        self._write("req_to_token", req.row * self.req_to_token.shape[1] + positions, np.zeros_like(target))
        freed = req.target_pages[keep:]
        # Invariant: a freed page leaves no mapping behind, not even at slots past the tail.
        self._clear_mapping(target, freed)
        self.target.free(freed)
        if self.draft is not None:
            self.draft.free(req.draft_pages[keep:])
            del req.draft_pages[keep:]
        del req.target_pages[keep:]
        req.length = length

    def _trim(self, req: Request, length: int | None) -> None:
        """Free draft slots of positions older than the window counted back from `length` (None: the request's);
        target slots stay."""
        frontier = self._trim_frontier(req.length if length is None else length, req.draft_start)
        if frontier == req.draft_start:
            return
        first, last = req.draft_start // self.P, frontier // self.P
        own = max(first, min(last, req.cached_pages))  # the cache's pages keep their draft KV (and mapping)
        self._clear_mapping(self._slots(req.target_pages, np.arange(own * self.P, frontier)), [])
        self.draft.free(req.draft_pages[own:last])
        req.draft_pages[first:last] = [0] * (last - first)
        req.draft_start = frontier
        if req.locked and frontier >= req.cached_pages * self.P:
            self.cache.release_draft(req.holder)  # its window has left the cached prefix: evictable now

    def _checkpoint(self, req: Request, tokens) -> None:
        """Cache a running request's first whole pages of `tokens` (SGLang's cache_unfinished_req).
        They become the cache's, locked by the request: its later out-of-window trims leave the draft
        KV of that prefix's window to the cache, so the prompt stays reusable after a long generation.
        Where the cache already held those tokens the request switches to the cache's pages (its own
        go back to the pools, its slot table is rewritten)."""
        keep = len(tokens) // self.P
        if keep <= req.cached_pages or not self._checkpoints(req):
            return
        if req.locked:
            self.cache.unlock(req.holder)
        model = self.models[req.session]
        self.cache.insert(
            model,
            tokens,
            req.target_pages[:keep],
            req.draft_pages[:keep] if self.draft is not None else [],
            revive_held=True,
        )
        match = self.cache.path(model, tokens, keep, req.draft_start // self.P)
        moved = [i for i in range(keep) if req.target_pages[i] != match.target_pages[i]]
        req.target_pages[:keep] = match.target_pages
        if self.draft is not None:
            first = req.draft_start // self.P
            req.draft_pages[first:keep] = match.draft_pages[first:keep]
        if moved:
            positions = self._page_slots(moved)  # the positions of the moved pages
            positions = positions[positions < req.length]
            self._write(
                "req_to_token",
                req.row * self.req_to_token.shape[1] + positions,
                self._slots(req.target_pages, positions),
            )
        req.cached_pages, req.prefix, req.locked = keep, tuple(tokens[: keep * self.P]), True
        self.cache.lock(req.holder, match)

    def _finish(self, req: Request, tokens) -> None:
        """End the request: unlock its cached prefix; its own pages for the first whole pages of
        `tokens` go into its model's tree (None, or a session without a model identity: nothing is cached),
        every other own page back to the pools. A client that does not write draft KV caches no draft KV.
        Its row is freed."""
        positions = np.arange(req.length)
        self._write("req_to_token", req.row * self.req_to_token.shape[1] + positions, np.zeros(req.length, np.int32))
        if req.locked:
            self.cache.unlock(req.holder)
        model = self.models[req.session]
        keep = len(tokens) // self.P if tokens is not None and model else req.cached_pages
        if self.mode is DraftMode.IDENTITY and not self.writes_draft[req.session]:
            keep = req.cached_pages  # its draft slots (== target slots) hold no draft KV: cache nothing
        own_draft = self._own_draft_from(req)
        if self.draft is not None and not self.writes_draft[req.session]:
            self._drop_draft(req, own_draft, keep)  # never written: not cached
        if keep > req.cached_pages:
            self.cache.insert(
                model, tokens, req.target_pages[:keep], req.draft_pages[:keep] if self.draft is not None else []
            )
        rest = req.target_pages[max(keep, req.cached_pages) :]
        self._clear_mapping(np.empty(0, np.int32), rest)
        self.target.free(rest)
        if self.draft is not None:
            self.draft.free(req.draft_pages[max(keep, own_draft) :])
        self.free_rows.append(req.row)
        del self.sessions[req.session][req.rid]

    def _drop_draft(self, req: Request, first: int, last: int) -> None:
        """Free own draft pages [first, last) that hold no valid KV, before they could be cached."""
        if last > first:
            self._clear_mapping(self._slots(req.target_pages, np.arange(first * self.P, last * self.P)), [])
            self.draft.free(req.draft_pages[first:last])
            req.draft_pages[first:last] = [0] * (last - first)

    # ---- helpers --------------------------------------------------------------------------
    def _slots(self, pages: list[int], positions: np.ndarray) -> np.ndarray:
        if len(positions) == 0:
            return np.empty(0, np.int32)
        page_of = np.asarray(pages, dtype=np.int64)[positions // self.P]
        return (page_of * self.P + positions % self.P).astype(np.int32)

    def _draft_slots(self, req: Request, positions: np.ndarray, target: np.ndarray) -> np.ndarray:
        if self.mode is DraftMode.BOUNDED:
            return self._slots(req.draft_pages, positions)
        if self.mode is DraftMode.IDENTITY:
            return target
        return np.zeros_like(target)

    def _page_slots(self, pages) -> np.ndarray:
        """Every slot (or position) of whole pages, in order."""
        return (np.asarray(pages, np.int64)[:, None] * self.P + np.arange(self.P)).reshape(-1)

    def _clear_mapping(self, slots: np.ndarray, pages: list[int]) -> None:
        if self.mapping is None:
            return
        idx = np.concatenate([slots.astype(np.int64), self._page_slots(pages)])
        self._write("target_to_draft", idx, np.zeros(len(idx), np.int32))

    def _write(self, name: str, flat_idx: np.ndarray, values: np.ndarray) -> None:
        if len(flat_idx) == 0:
            return
        table = self.mapping if name == "target_to_draft" else self.req_to_token
        table.reshape(-1)[flat_idx] = values
        self.on_write(name, np.asarray(flat_idx, np.int64), np.asarray(values, np.int32))

    def _draft_free_tokens(self) -> int:
        if self.draft is not None:
            return self.draft.free_tokens
        return self.target.free_tokens if self.mode is DraftMode.IDENTITY else 0

    # ---- queries ------------------------------------------------------------------------
    def translate(self, target_slots: np.ndarray) -> np.ndarray:
        if self.mapping is None:
            raise FailedPrecondition("memd runs without a draft pool: there is nothing to translate to")
        slots = np.asarray(target_slots, np.int64)
        bad = (slots < self.P) | (slots >= len(self.mapping))
        if bad.any():
            raise InvalidArgument(
                f"target slot {int(slots[bad][0])} is out of range: slots are {self.P}..{len(self.mapping) - 1}"
                " (page 0 is the sink)"
            )
        return self.mapping[slots].astype(np.int32)

    def requests(self):
        for held in self.sessions.values():
            yield from held.values()

    def held_tokens(self, session: str | None = None) -> tuple[int, int]:
        """Tokens held by running requests (of one session, or all), per side."""
        reqs = self.sessions.get(session, {}).values() if session else self.requests()
        target = draft = 0
        for req in reqs:  # own pages only: the cache's are counted as evictable or protected
            target += (len(req.target_pages) - req.cached_pages) * self.P
            draft += (len(req.target_pages) - self._own_draft_from(req)) * self.P
        if self.mode is DraftMode.NONE:
            draft = 0
        return target, draft
