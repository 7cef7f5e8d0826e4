"""The prefix cache's eviction order without a scan of its trees: a heap of (last access, push order, node) entries.

A node is offered whenever its state may have changed (the cache offers it at every _account(+1), which closes
every mutation, and when eviction leaves its parent childless); an entry is only checked when it is popped, and it
counts only if its node is still a candidate and was not touched since (its last access is the entry's). So a
candidate is always found through its newest entry, in least-recently-used order (ties: the order offered), and an
eviction costs O(log entries) a node instead of O(nodes in every tree).

Invariant (PrefixCache.check): every candidate has an entry with its current last access. Stale entries are
dropped when they outnumber the live ones (compaction: amortized O(1) a push)."""

import heapq
import itertools
from typing import Callable


class LruHeap:
    def __init__(self, is_candidate: Callable[[object], bool]):
        self.is_candidate = is_candidate  # node -> whether it may be evicted now (a detached node never is)
        self.entries: list[tuple[int, int, object]] = []
        self._order = itertools.count()
        self._compact_at = 64

    def offer(self, node) -> None:
        """Remember the node if it is a candidate now."""
        if self.is_candidate(node):
            heapq.heappush(self.entries, (node.last_access, next(self._order), node))
            if len(self.entries) > self._compact_at:
                self._compact()

    def pop(self):
        """The least recently used candidate, or None when there is none. The caller evicts it (a candidate no more:
        another current entry of it, offered twice at one time, is then skipped)."""
        while self.entries:
            stamp, _, node = heapq.heappop(self.entries)
            if self._current(stamp, node):
                return node
        return None

    def current_ids(self) -> set[int]:
        """id() of every node with a current entry (the invariant's check)."""
        return {id(node) for stamp, _, node in self.entries if self._current(stamp, node)}

    def _current(self, stamp: int, node) -> bool:
        return stamp == node.last_access and self.is_candidate(node)

    def _compact(self) -> None:
        """Keep one current entry a node; the next compaction when the heap has doubled again."""
        newest: dict[int, tuple[int, int, object]] = {}
        for entry in self.entries:
            if self._current(entry[0], entry[2]):
                newest.setdefault(id(entry[2]), entry)
        self.entries = list(newest.values())
        heapq.heapify(self.entries)
        self._compact_at = 2 * len(self.entries) + 64
