"""Two-sided slot allocation: target pages, draft pages, the target->draft mapping and
the per-request slot table (req_to_token), for whole scheduler steps.

Positions of a request live in pages: position p sits at page `pages[p // P]`, offset
`p % P`, on both sides, so a token's in-page offset is the same in the target and draft
pools. The mapping is nonzero exactly at target slots of live positions that hold a
draft slot; every other entry (free slots, released tails, trimmed positions) is 0.
"""

from dataclasses import dataclass, field
from enum import Enum
from typing import Callable

import numpy as np

from memd.errors import FailedPrecondition, InvalidArgument, InvariantViolation, NotFound, ResourceExhausted
from memd.pages import PagePool


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


@dataclass(frozen=True)
class Release:
    commits: tuple[tuple[str, int], ...] = ()
    trims: tuple[str, ...] = ()
    finishes: tuple[str, ...] = ()


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

    # ---- sessions ------------------------------------------------------------------
    def open_session(self, session: str) -> None:
        self.sessions[session] = {}

    def close_session(self, session: str) -> None:
        """The lease ended: free every request the session held."""
        for rid in list(self.sessions.get(session, {})):
            self._finish(self.sessions[session][rid])
        self.sessions.pop(session, None)

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
        short = []
        if need > self.target.free_pages + freed_t:
            short.append(f"target needs {need * self.P} tokens, {(self.target.free_pages + freed_t) * self.P} free")
        if self.draft is not None and need > self.draft.free_pages + freed_d:
            short.append(f"draft needs {need * self.P} tokens, {(self.draft.free_pages + freed_d) * self.P} free")
        if new_rows > len(self.free_rows) + freed_rows:
            short.append(f"{new_rows} new requests, {len(self.free_rows) + freed_rows} request rows free")
        if short:
            raise ResourceExhausted("; ".join(short))
        self._apply_release(held, release)
        out = [self._extend(session, rid, n) for rid, _, n in extends]
        return out + [self._extend(session, rid, n) for rid, n in grows]

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
        for rid in release.trims:
            self._trim(held[rid])
        for rid in release.finishes:
            self._finish(held[rid])
        return self.target.free_tokens - before[0], self._draft_free_tokens() - before[1]

    def _plan_release(self, held: dict[str, Request], release: Release) -> dict[str, tuple[int, int]]:
        """Validates the release; returns rid -> (length, draft_start) after it."""
        after = {}
        for kind, rids in (("commit", [r for r, _ in release.commits]), ("trim", release.trims), ("finish", release.finishes)):
            if len(set(rids)) != len(rids):
                raise InvalidArgument(f"a request appears twice in {kind}")
            for rid in rids:
                if rid not in held:
                    raise NotFound(f"request {rid!r} is not held by this session")
        for rid, length in release.commits:
            req = held[rid]
            if not req.draft_start <= length <= req.length:
                raise InvalidArgument(
                    f"commit of {rid!r} to length {length}: must lie in [{req.draft_start}, {req.length}]"
                )
            after[rid] = (length, req.draft_start)
        for rid in release.trims:
            length, start = after.get(rid, (held[rid].length, held[rid].draft_start))
            after[rid] = (length, self._trim_frontier(length, start))
        for rid in release.finishes:
            after[rid] = None
        return after

    def _freed(self, held, after, release) -> tuple[int, int, int]:
        """Pages each side gets back from the release, and request rows."""
        freed_t = freed_d = 0
        for rid, state in after.items():
            req = held[rid]
            if state is None:
                freed_t += len(req.target_pages)
                freed_d += len(req.target_pages) - req.draft_start // self.P
                continue
            length, start = state
            freed_t += len(req.target_pages) - self._pages_for(length)
            freed_d += len(req.target_pages) - self._pages_for(length) + (start - req.draft_start) // self.P
        return freed_t, freed_d, len(release.finishes)

    def _plan_allocs(self, held, after, extends, grows) -> tuple[int, int]:
        """Validates allocations; returns (new requests, pages needed per side)."""
        seen, new_rows, need = set(), 0, 0
        for rid, prefix_len, n in extends:
            self._check_alloc_rid(rid, seen, after, n)
            state = after.get(rid) or ((held[rid].length, 0) if rid in held else None)
            if state is None:
                if prefix_len != 0:
                    raise FailedPrecondition(
                        f"request {rid!r} is new: prefill starts at 0 (reusing a prefix needs the prefix cache)"
                    )
                new_rows += 1
                length = 0
            else:
                length = state[0]
                if prefix_len != length:
                    raise InvalidArgument(f"extend of {rid!r} at prefix_len {prefix_len}, but it holds {length} positions")
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
            raise InvalidArgument(f"request {rid!r} would reach {length + n} tokens, beyond the context of {self.context_len}")
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

    def _trim(self, req: Request) -> None:
        """Free draft slots of positions older than the window; target slots stay."""
        frontier = self._trim_frontier(req.length, req.draft_start)
        if frontier == req.draft_start:
            return
        first, last = req.draft_start // self.P, frontier // self.P
        self._clear_mapping(self._slots(req.target_pages, np.arange(req.draft_start, frontier)), [])
        self.draft.free(req.draft_pages[first:last])
        req.draft_pages[first:last] = [0] * (last - first)
        req.draft_start = frontier

    def _finish(self, req: Request) -> None:
        """Free the whole request: both sides, its mapping and its row."""
        positions = np.arange(req.length)
        self._write("req_to_token", req.row * self.req_to_token.shape[1] + positions, np.zeros(req.length, np.int32))
        self._clear_mapping(np.empty(0, np.int32), req.target_pages)
        self.target.free(req.target_pages)
        if self.draft is not None:
            self.draft.free(req.draft_pages[req.draft_start // self.P :])
        self.free_rows.append(req.row)
        del self.sessions[req.session][req.rid]

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

    def _clear_mapping(self, slots: np.ndarray, pages: list[int]) -> None:
        if self.mapping is None:
            return
        page_slots = (np.asarray(pages, np.int64)[:, None] * self.P + np.arange(self.P)).reshape(-1)
        idx = np.concatenate([slots.astype(np.int64), page_slots])
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
        for req in reqs:
            target += len(req.target_pages) * self.P
            draft += (len(req.target_pages) - req.draft_start // self.P) * self.P
        if self.mode is DraftMode.NONE:
            draft = 0
        return target, draft
