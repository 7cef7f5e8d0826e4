"""The prefix cache: a radix tree over token ids per model identity, whose nodes own target pages and,
in a bounded draft pool, the draft pages still live for them.

Model identity: KV computed by one model's weights is garbage to another model of the same shape, so
every tree belongs to one identity (a fingerprint the client sends at Attach) and a lookup or insert
walks only its own model's tree. A tree is made at its model's first insert and dropped when eviction
leaves it empty. Eviction and the counters span every tree: the least recently used evictable node
is chosen over all models (one clock), so one model's cached prefixes give way to another's by age.

Granularity is the page: every node's key is a whole number of pages of tokens, children are
keyed by their first page. A node in a bounded pool keeps one draft page per target page, 0
where the draft KV is gone (a tombstone): freed out of window while its request ran, or evicted
from the draft side since. Requests that matched a path hold it: `holders` on every node from
the match's end to the root (target KV protected), `draft_holders` on the nodes that overlap the
last `window` tokens of the match (draft KV protected). Holder sets, not counts, so a node split
keeps every holder on both halves and releasing walks the path once.

Counters (pages): target evictable / protected, draft evictable / protected. A node's target
pages are protected while it has holders, else evictable; its live draft pages are protected
while it has draft holders, else evictable. Every mutation goes through _account(-1) ... _account(+1).
"""

import itertools
from dataclasses import dataclass, field
from typing import Callable

from memd.errors import InvariantViolation
from memd.lru_heap import LruHeap
from memd.pages import PagePool

Holder = tuple[str, str]  # (session, rid)
Model = str  # a model identity, never empty here (a session without one has no prefix cache)
MappingWriter = Callable[[list[int], list[int] | None], None]  # target pages -> draft pages (None: clear)


@dataclass(eq=False)
class Node:
    key: tuple[int, ...]  # tokens, len(key) == P * len(target_pages)
    target_pages: list[int]
    draft_pages: list[int]  # bounded pool: one per target page, 0 = no draft KV; else empty
    parent: "Node | None"  # None: a tree's root (no key, no pages)
    start: int  # page index of the node's first page in its sequences
    children: dict = field(default_factory=dict)
    holders: set = field(default_factory=set)
    draft_holders: set = field(default_factory=set)
    last_access: int = 0
    detached: bool = False  # evicted: out of its tree for good

    @property
    def end(self) -> int:
        return self.start + len(self.target_pages)

    def live_draft(self) -> list[int]:
        return [d for d in self.draft_pages if d]


@dataclass(frozen=True)
class Match:
    node: Node  # the last node of the usable match (a root when nothing matched)
    pages: int  # usable cached pages
    target_pages: list[int]
    draft_pages: list[int]  # bounded pool: per page, 0 below draft_from; else empty
    draft_from: int  # first page whose draft KV the request uses (== pages when it needs none)


class PrefixCache:
    def __init__(
        self, page_size: int, target: PagePool, draft: PagePool | None, window: int, set_mapping: MappingWriter
    ):
        self.P = page_size
        self.target = target
        self.draft = draft  # None unless the draft pool is bounded
        self.window = window
        self.set_mapping = set_mapping
        self.roots: dict[Model, Node] = {}  # one tree per model identity, none empty
        self.locks: dict[Holder, Node] = {}
        self.evictable_t = self.protected_t = self.evictable_d = self.protected_d = 0  # pages
        self._clock = itertools.count(1)
        # What eviction takes, least recently used first: unprotected leaves (target), nodes with unprotected live
        # draft KV (draft). Every node is offered to both at each _account(+1).
        self.lru_target = LruHeap(lambda n: not n.detached and not n.children and not n.holders)
        self.lru_draft = LruHeap(lambda n: not n.detached and not n.draft_holders and any(n.draft_pages))

    # ---- bookkeeping -------------------------------------------------------------------
    def _account(self, node: Node, sign: int) -> None:
        if node.parent is None:
            return
        pages, live = len(node.target_pages), len(node.live_draft())
        if node.holders:
            self.protected_t += sign * pages
        else:
            self.evictable_t += sign * pages
        if node.draft_holders:
            self.protected_d += sign * live
        else:
            self.evictable_d += sign * live
        if sign > 0:  # the mutation is done: the node may be a candidate now, or one touched since its last entry
            self.lru_target.offer(node)
            self.lru_draft.offer(node)

    def _path(self, node: Node):
        while node.parent is not None:
            yield node
            node = node.parent

    def _common_pages(self, node: Node, tokens, at: int) -> int:
        P, k = self.P, 0
        while (
            k < len(node.target_pages)
            and tuple(tokens[(at + k) * P : (at + k + 1) * P]) == node.key[k * P : (k + 1) * P]
        ):
            k += 1
        return k

    def _split(self, node: Node, k: int) -> Node:
        """Cut `node` after k pages; the new upper node keeps its holders (every path through it did)."""
        P = self.P
        self._account(node, -1)
        upper = Node(
            node.key[: k * P],
            node.target_pages[:k],
            node.draft_pages[:k],
            node.parent,
            node.start,
            holders=set(node.holders),
            draft_holders=set(node.draft_holders),
            last_access=node.last_access,
        )
        node.parent.children[upper.key[:P]] = upper
        node.key, node.target_pages, node.draft_pages = node.key[k * P :], node.target_pages[k:], node.draft_pages[k:]
        node.start += k
        node.parent = upper
        upper.children[node.key[:P]] = node
        self._account(upper, +1)
        self._account(node, +1)
        return upper

    # ---- match and lock -----------------------------------------------------------------
    def _root(self, model: Model) -> Node:
        """The model's tree; an empty root of no tree when it has none (a walk finds nothing there)."""
        return self.roots.get(model) or Node((), [], [], None, 0)

    def _walk(self, model: Model, tokens, max_pages: int, split: bool) -> tuple[Node, list[Node], int]:
        """The nodes along the longest prefix of `tokens` (at most max_pages) cached for `model` and its
        length in pages; with `split` the last node is cut so that the path ends exactly there."""
        node, path, at = self._root(model), [], 0
        while at < max_pages:
            child = node.children.get(tuple(tokens[at * self.P : (at + 1) * self.P]))
            if child is None:
                break
            k = min(self._common_pages(child, tokens, at), max_pages - at)
            if k < len(child.target_pages):
                if not split:
                    return child, path + [child], at + k
                child = self._split(child, k)
            path.append(child)
            node, at = child, at + k
        return node, path, at

    def match(self, model: Model, tokens, needs_draft: bool) -> Match:
        """The usable prefix of `tokens` cached for `model` (whole pages). Needing draft KV (a bounded pool and a
        client that writes draft KV), a prefix of p pages is usable only if pages
        [max(0, p*P - window) // P, p) all hold live draft KV; a longer match shortens to the
        longest usable one (the rest is prefilled again, which rebuilds the draft window)."""
        P = self.P
        _, path, pages = self._walk(model, tokens, len(tokens) // P, split=False)
        bounded = self.draft is not None and needs_draft
        if bounded:
            pages = self._usable_pages([d for n in path for d in n.draft_pages][:pages])
        return self.path(model, tokens, pages, max(0, pages * P - self.window) // P if bounded else pages)

    def path(self, model: Model, tokens, pages: int, draft_from: int) -> Match:
        """The path of exactly `pages` pages of `tokens` cached for `model` (cut to end there), as a Match
        whose draft KV is used from page `draft_from` on. In a bounded pool the path is cut at `draft_from` too, so
        that a lock protects the draft KV of the window's pages alone (a node reaching back past the window would
        protect its out-of-window draft pages: more than the request cap allows a request)."""
        if self.draft is not None and 0 < draft_from < pages:
            self._walk(model, tokens, draft_from, split=True)
        node, path, at = self._walk(model, tokens, pages, split=True)
        assert at == pages, (at, pages)
        target = [t for n in path for t in n.target_pages]
        draft = (
            ([0] * draft_from + [d for n in path for d in n.draft_pages][draft_from:]) if self.draft is not None else []
        )
        return Match(node, pages, target, draft, draft_from)

    def _usable_pages(self, draft: list[int]) -> int:
        last_dead = -1
        best = 0
        for p in range(1, len(draft) + 1):
            if not draft[p - 1]:
                last_dead = p - 1
            if last_dead < max(0, p * self.P - self.window) // self.P:
                best = p
        return best

    def lock(self, holder: Holder, match: Match) -> None:
        """Protect the match for a request: target KV along the whole path, draft KV over its window."""
        self.locks[holder] = match.node
        now = next(self._clock)
        for node in self._path(match.node):
            self._account(node, -1)
            node.holders.add(holder)
            if node.end > match.draft_from:
                node.draft_holders.add(holder)
            node.last_access = now
            self._account(node, +1)

    def unlock(self, holder: Holder) -> None:
        for node in self._path(self.locks.pop(holder)):
            self._account(node, -1)
            node.holders.discard(holder)
            node.draft_holders.discard(holder)
            self._account(node, +1)

    def release_draft(self, holder: Holder) -> None:
        """The holder's window has moved past its cached prefix: stop protecting that draft KV."""
        for node in self._path(self.locks[holder]):
            if holder in node.draft_holders:
                self._account(node, -1)
                node.draft_holders.discard(holder)
                self._account(node, +1)

    def released_by(self, holders: set[Holder], draft_only: set[Holder] = frozenset()) -> tuple[int, int]:
        """Pages (target, live draft) that would turn evictable if `holders` unlocked and `draft_only`
        released their draft protection."""
        seen, target, draft = set(), 0, 0
        releasing = set(holders) | set(draft_only)
        for holder in releasing:
            for node in self._path(self.locks[holder]):
                if id(node) in seen:
                    continue
                seen.add(id(node))
                if node.holders and node.holders <= holders:
                    target += len(node.target_pages)
                if node.draft_holders and node.draft_holders <= releasing:
                    draft += len(node.live_draft())
        return target, draft

    def newly_protected(
        self, model: Model, tokens, pages: int, draft_from: int, gone: set[Holder], gone_draft: set[Holder]
    ) -> tuple[int, int]:
        """Pages (target, live draft) now evictable, or freed of their holders by this call (`gone`,
        `gone_draft`), that locking the path of `pages` pages of `tokens` (of `model`) from `draft_from`
        would protect."""
        _, path, at = self._walk(model, tokens, pages, split=False)
        target = draft = 0
        for node in path:
            live = node.draft_pages[: max(0, min(at, node.end) - node.start)]
            if node.holders <= gone:
                target += len(live) if self.draft is not None else max(0, min(at, node.end) - node.start)
            if min(at, node.end) > draft_from and node.draft_holders <= gone_draft:
                # the lock cuts the path at draft_from (path()): only the window's pages are protected
                draft += sum(1 for d in live[max(0, draft_from - node.start) :] if d)
        return target, draft

    def duplicates(self, model: Model, tokens, first: int, last: int, draft_pages: list[int]) -> tuple[int, int]:
        """Pages (target, draft) that inserting pages [first, last) of `tokens` for `model` would hand back
        as duplicates of what its tree holds (draft: a live request page where the tree's is live too)."""
        _, path, at = self._walk(model, tokens, last, split=False)
        flat_d = [d for n in path for d in n.draft_pages]
        target = max(0, min(at, last) - first)
        draft = sum(1 for i in range(first, min(at, last)) if draft_pages and draft_pages[i] and flat_d[i])
        return target, draft

    # ---- insert -------------------------------------------------------------------------
    def insert(
        self, model: Model, tokens, target_pages: list[int], draft_pages: list[int], revive_held: bool = False
    ) -> None:
        """Take a finished request's pages for `tokens` into `model`'s tree (whole pages; draft_pages per
        page, 0 where its draft KV is gone, or empty without a bounded pool). Pages the tree already
        holds for the same tokens are duplicates and go back to the pools; a tombstone the
        request has live draft KV for is revived with it (unless other requests protect the node, which
        `revive_held` allows: a running request's checkpoint, which changes no free count it promised).
        Invariant: every page passed in ends up owned by the tree or free, exactly once."""
        P, n = self.P, len(target_pages)
        if n and model not in self.roots:
            self.roots[model] = Node((), [], [], None, 0)
        node, at = self._root(model), 0
        now = next(self._clock)
        while at < n:
            child = node.children.get(tuple(tokens[at * P : (at + 1) * P]))
            if child is None:
                new = Node(
                    tuple(tokens[at * P : n * P]),
                    list(target_pages[at:]),
                    list(draft_pages[at:]),
                    node,
                    at,
                    last_access=now,
                )
                node.children[new.key[:P]] = new
                self._account(new, +1)
                return
            k = min(self._common_pages(child, tokens, at), n - at)
            if k < len(child.target_pages):
                child = self._split(child, k)
            self._account(child, -1)
            for m in range(k):
                self._merge_page(child, m, target_pages[at + m], draft_pages[at + m] if draft_pages else 0, revive_held)
            child.last_access = now
            self._account(child, +1)
            node, at = child, at + k

    def _merge_page(self, node: Node, m: int, req_t: int, req_d: int, revive_held: bool) -> None:
        node_t = node.target_pages[m]
        node_d = node.draft_pages[m] if node.draft_pages else 0
        if req_d and req_d != node_d:
            if not node_d and (revive_held or not node.draft_holders):
                node.draft_pages[m] = req_d  # tombstone revived with the request's draft KV
                self.set_mapping([node_t], [req_d])
            else:
                self.draft.free([req_d])
        if req_t != node_t:
            self.set_mapping([req_t], None)
            self.target.free([req_t])

    # ---- eviction ------------------------------------------------------------------------
    def _nodes(self):
        """Every node of every tree (roots excluded)."""
        stack = [child for root in self.roots.values() for child in root.children.values()]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            yield node

    def evict_target(self, pages: int) -> int:
        """Free least-recently-used unprotected leaves of any tree (target and draft KV) until `pages`
        target pages came back or nothing is evictable; drop the trees left empty. Returns target pages
        freed."""
        freed = 0
        while freed < pages:
            node = self.lru_target.pop()
            if node is None:
                break
            self._account(node, -1)
            parent = node.parent
            del parent.children[node.key[: self.P]]
            node.detached = True
            self.set_mapping(node.target_pages, None)
            self.target.free(node.target_pages)
            if self.draft is not None:
                self.draft.free(node.live_draft())
            freed += len(node.target_pages)
            if parent.parent is not None:
                self.lru_target.offer(parent)  # a leaf now, perhaps
        for model in [model for model, root in self.roots.items() if not root.children]:
            del self.roots[model]
        return freed

    def evict_draft(self, pages: int) -> int:
        """Free the draft KV of least-recently-used nodes of any tree outside every protected window, keeping
        their target KV (they become tombstones). Returns draft pages freed."""
        freed = 0
        while freed < pages:
            node = self.lru_draft.pop()
            if node is None:
                break
            self._account(node, -1)
            live = [(t, d) for t, d in zip(node.target_pages, node.draft_pages) if d]
            self.set_mapping([t for t, _ in live], None)
            self.draft.free([d for _, d in live])
            node.draft_pages = [0] * len(node.draft_pages)
            self._account(node, +1)
            freed += len(live)
        return freed

    def flush(self) -> None:
        """Empty every tree; the caller has checked that no request holds any of it."""
        assert not self.locks
        self.evict_target(self.evictable_t)
        if self.roots:
            raise InvariantViolation("prefix cache: nodes left after a flush")

    # ---- checks ---------------------------------------------------------------------------
    def owned(self) -> tuple[list[int], list[tuple[int, int]]]:
        """Target pages the tree owns, and (target page, draft page) pairs with live draft KV."""
        target, live = [], []
        for node in self._nodes():
            target += node.target_pages
            live += [(t, d) for t, d in zip(node.target_pages, node.draft_pages) if d]
        return target, live

    def check(self) -> None:
        """Counters, keys, page positions and holder sets, recomputed from scratch; no tree is empty; every node
        eviction may take is in its heap with its current last access (memd.lru_heap's invariant)."""
        if not all(root.children for root in self.roots.values()):
            raise InvariantViolation("prefix cache: an empty tree is kept")
        counts = [0, 0, 0, 0]
        heaps = [
            (heap, side, heap.current_ids()) for heap, side in ((self.lru_target, "target"), (self.lru_draft, "draft"))
        ]
        for node in self._nodes():
            pages = len(node.target_pages)
            if (
                pages == 0
                or len(node.key) != pages * self.P
                or node.parent.children.get(node.key[: self.P]) is not node
            ):
                raise InvariantViolation(f"prefix cache: malformed node at page {node.start}")
            if node.start != node.parent.end or (self.draft is not None and len(node.draft_pages) != pages):
                raise InvariantViolation(f"prefix cache: node at page {node.start} misplaced")
            if not node.draft_holders <= node.holders or (
                node.parent.parent is not None and not node.holders <= node.parent.holders
            ):
                raise InvariantViolation(f"prefix cache: holders of node at page {node.start} are not a path")
            live = len(node.live_draft())
            counts[1 if node.holders else 0] += pages
            counts[3 if node.draft_holders else 2] += live
            for heap, side, listed in heaps:
                if heap.is_candidate(node) and id(node) not in listed:
                    raise InvariantViolation(
                        f"prefix cache: node at page {node.start} is evictable ({side}) but not in the eviction heap"
                    )
        if counts != [self.evictable_t, self.protected_t, self.evictable_d, self.protected_d]:
            raise InvariantViolation(
                "prefix cache counters (evictable/protected target, draft) "
                f"{[self.evictable_t, self.protected_t, self.evictable_d, self.protected_d]}"
                f" != recounted {counts}"
            )
