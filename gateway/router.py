"""Which modeld serves a request: the one that recently served a prompt sharing the longest prefix with it (so its
memd's prefix cache hits), unless that one is overloaded against the least loaded; otherwise the least loaded.

Prompts are keyed by hashes of their prefixes at multiples of `block_chars` characters (and of the whole prompt),
in a bounded LRU map from key to modeld: a text stand-in for the token prefix memd caches."""

import hashlib
from collections import OrderedDict

from gateway.backends import Backend

MAX_BLOCKS = 64  # prefixes keyed per prompt: longer prompts are keyed by their first MAX_BLOCKS blocks


class Router:
    def __init__(self, block_chars: int, max_entries: int, max_imbalance: int):
        self.block_chars = block_chars
        self.max_entries = max_entries
        self.max_imbalance = max_imbalance
        self.recent: OrderedDict[bytes, int] = OrderedDict()  # prefix key -> backend index

    def pick(self, prompt: str, candidates: list[Backend]) -> Backend:
        """A backend among `candidates` (not empty), remembered for the prompt's prefixes."""
        least = min(candidates, key=lambda b: b.load)
        keys = self.prefix_keys(prompt)
        chosen = self._affine(keys, candidates, least.load) or least
        self._remember(keys, chosen.index)
        return chosen

    def _affine(self, keys: list[bytes], candidates: list[Backend], least_load: int) -> Backend | None:
        by_index = {b.index: b for b in candidates}
        for key in reversed(keys):  # the longest shared prefix first
            backend = by_index.get(self.recent.get(key, -1))
            if backend is not None:
                return backend if backend.load - least_load <= self.max_imbalance else None
        return None

    def _remember(self, keys: list[bytes], index: int) -> None:
        if not self.max_entries:
            return
        for key in keys:
            self.recent[key] = index
            self.recent.move_to_end(key)
        while len(self.recent) > self.max_entries:
            self.recent.popitem(last=False)

    def prefix_keys(self, prompt: str) -> list[bytes]:
        """Hashes of the prompt's prefixes at every block boundary (up to MAX_BLOCKS), then of the whole prompt."""
        digest = hashlib.blake2b(digest_size=16)
        keys = []
        end = min(len(prompt), self.block_chars * MAX_BLOCKS)
        for start in range(0, end - self.block_chars + 1, self.block_chars):
            digest.update(prompt[start : start + self.block_chars].encode("utf-8", "surrogatepass"))
            keys.append(digest.copy().digest())
        whole = hashlib.blake2b(prompt.encode("utf-8", "surrogatepass"), digest_size=16, person=b"whole").digest()
        return [*keys, whole]
