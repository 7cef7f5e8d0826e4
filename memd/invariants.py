"""The leak invariant and the structural invariants of a SlotManager.

Leak invariant, per side: free + evictable + protected + held by running requests == total,
where evictable and protected are the prefix cache's pages and "held" counts a request's own
pages only (its matched prefix belongs to the cache).
"""

import numpy as np

from memd.errors import InvariantViolation
from memd.slots import DraftMode, SlotManager


def check_leak(mgr: SlotManager) -> None:
    held_target, held_draft = mgr.held_tokens()
    ev_t, prot_t, ev_d, prot_d = mgr.cache_counts()
    sides = [("target", mgr.target.free_tokens, held_target, mgr.target.total_tokens, ev_t, prot_t)]
    if mgr.draft is not None:
        sides.append(("draft", mgr.draft.free_tokens, held_draft, mgr.draft.total_tokens, ev_d, prot_d))
    for side, free, held, total, evictable, protected in sides:
        if free + evictable + protected + held != total:
            raise InvariantViolation(
                f"leak invariant broken on the {side} side: free {free} + evictable {evictable} + "
                f"protected {protected} + held {held} = {free + evictable + protected + held} != total {total}"
            )
    rows_used = sum(1 for _ in mgr.requests())
    if rows_used + len(mgr.free_rows) != mgr.max_requests:
        raise InvariantViolation(f"request rows: {rows_used} used + {len(mgr.free_rows)} free != {mgr.max_requests}")


def check_structure(mgr: SlotManager) -> None:
    """Everything the allocator promises, checked from scratch (O(pool size))."""
    check_leak(mgr)
    mgr.cache.check()
    P = mgr.P
    mgr.target.check()
    if mgr.draft is not None:
        mgr.draft.check()
    expected_map = np.zeros_like(mgr.mapping) if mgr.mapping is not None else None
    expected_rows = np.zeros_like(mgr.req_to_token)
    target_owner = np.zeros(mgr.target.num_pages + 1, np.int64)
    draft_owner = np.zeros((mgr.draft.num_pages if mgr.draft else 0) + 1, np.int64)
    cached_target, cached_live = mgr.cache.owned()
    np.add.at(target_owner, cached_target, 1)
    np.add.at(draft_owner, [d for _, d in cached_live], 1)
    if expected_map is not None:
        pairs = np.asarray(cached_live, np.int64).reshape(-1, 2)
        if mgr.mode is DraftMode.IDENTITY:
            pairs = np.repeat(np.asarray(cached_target, np.int64), 2).reshape(-1, 2)
        expected_map[(pairs[:, :1] * P + np.arange(P)).ravel()] = (pairs[:, 1:] * P + np.arange(P)).ravel()
    cached_set, cached_draft = set(cached_target), dict(cached_live)
    for req in mgr.requests():
        if len(req.target_pages) != -(-req.length // P) or req.draft_start % P:
            raise InvariantViolation(f"request {req.rid!r}: {len(req.target_pages)} pages for length {req.length}")
        if not set(req.target_pages[: req.cached_pages]) <= cached_set:
            raise InvariantViolation(f"request {req.rid!r}: its matched prefix is not in the prefix cache")
        for i in range(req.draft_start // P, req.cached_pages) if mgr.draft is not None else ():
            if cached_draft.get(req.target_pages[i]) != req.draft_pages[i]:
                raise InvariantViolation(
                    f"request {req.rid!r}: draft page of cached page {i} is not the cache's live one"
                )
        np.add.at(target_owner, req.target_pages[req.cached_pages :], 1)
        positions = np.arange(req.length)
        target = mgr._slots(req.target_pages, positions)
        expected_rows[req.row, : req.length] = target
        if mgr.draft is not None:
            live = req.draft_pages[req.draft_start // P :]
            if 0 in live or any(req.draft_pages[: req.draft_start // P]):
                raise InvariantViolation(f"request {req.rid!r}: draft pages disagree with draft_start")
            np.add.at(draft_owner, req.draft_pages[mgr._own_draft_from(req) :], 1)
        if expected_map is not None:
            window = positions[req.draft_start :]
            expected_map[target[req.draft_start :]] = mgr._draft_slots(req, window, target[req.draft_start :])
    _check_pages("target", mgr.target, target_owner)
    if mgr.draft is not None:
        _check_pages("draft", mgr.draft, draft_owner)
    if not np.array_equal(mgr.req_to_token, expected_rows):
        raise InvariantViolation("req_to_token disagrees with the requests' slots (stale or missing rows)")
    if expected_map is not None:
        if not np.array_equal(mgr.mapping, expected_map):
            bad = np.flatnonzero(mgr.mapping != expected_map)[:8]
            raise InvariantViolation(f"target->draft mapping is stale or wrong at target slots {bad.tolist()}")
        live = expected_map[expected_map != 0]
        if len(np.unique(live)) != len(live):
            raise InvariantViolation("target->draft mapping is not injective on live slots")
        if mgr.mode is DraftMode.BOUNDED and (live // P == 0).any():
            raise InvariantViolation("a live position maps to the draft sink page")


def _check_pages(side: str, pool, owner: np.ndarray) -> None:
    if owner[0]:
        raise InvariantViolation(f"{side}: the sink page 0 is held by a request")
    if (owner > 1).any():
        raise InvariantViolation(f"{side}: page {int(np.argmax(owner > 1))} is held twice")
    if (owner[1:].astype(bool) & pool._is_free[1:]).any():
        raise InvariantViolation(f"{side}: a page is both free and held")
    if int((owner[1:] == 0).sum()) != pool.free_pages:
        raise InvariantViolation(f"{side}: {pool.free_pages} free pages, but {int((owner[1:] == 0).sum())} unheld")
