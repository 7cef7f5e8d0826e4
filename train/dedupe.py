"""Deduplication of training prompts and the hold-out check against evaluation sets.

- `normalise`: lower case, Unicode NFKC, every run of non-alphanumeric characters one space. Two prompts
  with the same normalised text are exact duplicates (case, punctuation, spacing and markup differ).
- Near duplicates: MinHash over word 5-gram shingles of the normalised text (stable hashes: blake2b, so a
  build is reproducible whatever PYTHONHASHSEED), banded LSH, then the estimated Jaccard similarity of each
  candidate pair; the first prompt of a pair at or above `threshold` is kept (sources are processed in a
  fixed order, so the outcome is reproducible).
- `HoldOut`: a prompt is dropped when its normalised text equals an evaluation item's, contains it, or
  shares at least `containment` of the evaluation item's word 6-gram shingles (an evaluation question
  pasted into a longer prompt, reworded at the edges, or with its punctuation changed).
"""

import hashlib
import re
import unicodedata

import numpy as np

_NON_WORD = re.compile(r"[\W_]+", re.UNICODE)
_PRIME = (1 << 61) - 1


def normalise(text: str) -> str:
    return _NON_WORD.sub(" ", unicodedata.normalize("NFKC", text).lower()).strip()


def stable_hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def shingles(norm: str, n: int) -> set[str]:
    words = norm.split()
    if len(words) <= n:
        return {" ".join(words)} if words else set()
    return {" ".join(words[i : i + n]) for i in range(len(words) - n + 1)}


class MinHashDeduper:
    """Streaming near-duplicate filter: `add(text)` is True if the text is new (and remembers it)."""

    def __init__(self, threshold: float = 0.8, bands: int = 16, rows: int = 4, shingle: int = 5, seed: int = 1):
        self.threshold, self.bands, self.rows, self.shingle = threshold, bands, rows, shingle
        rng = np.random.default_rng(seed)
        perms = bands * rows
        self.a = rng.integers(1, _PRIME, perms, dtype=np.uint64)
        self.b = rng.integers(0, _PRIME, perms, dtype=np.uint64)
        self.exact: set[str] = set()
        self.buckets: list[dict[bytes, int]] = [{} for _ in range(bands)]
        self.signatures: list[np.ndarray] = []

    def signature(self, norm: str) -> np.ndarray:
        hashes = np.array([stable_hash(s) & 0xFFFFFFFF for s in shingles(norm, self.shingle)] or [0], dtype=np.uint64)
        # a reduced to 31 bits and h < 2^32: a * h + b stays below 2^64 (no wrap-around)
        mixed = ((self.a[:, None] & np.uint64(0x7FFFFFFF)) * hashes[None, :] + self.b[:, None]) % np.uint64(_PRIME)
        return mixed.min(axis=1)

    def add(self, text: str) -> bool:
        norm = normalise(text)
        if norm in self.exact:
            return False
        sig = self.signature(norm)
        keys = [sig[i * self.rows : (i + 1) * self.rows].tobytes() for i in range(self.bands)]
        for band, key in enumerate(keys):
            other = self.buckets[band].get(key)
            if other is not None and float(np.mean(self.signatures[other] == sig)) >= self.threshold:
                return False
        index = len(self.signatures)
        self.signatures.append(sig)
        self.exact.add(norm)
        for band, key in enumerate(keys):
            self.buckets[band].setdefault(key, index)
        return True


class HoldOut:
    """Evaluation items that no training prompt may contain (see the module docstring)."""

    def __init__(self, items: list[str], containment: float = 0.5, shingle: int = 6):
        self.containment, self.shingle = containment, shingle
        self.items = [normalise(t) for t in items if normalise(t)]
        self.item_shingles = [shingles(n, shingle) for n in self.items]
        self.index: dict[str, list[int]] = {}
        for i, sh in enumerate(self.item_shingles):
            for s in sh:
                self.index.setdefault(s, []).append(i)

    def hits(self, text: str) -> bool:
        norm = normalise(text)
        if not norm:
            return False
        counts: dict[int, int] = {}
        for s in shingles(norm, self.shingle):
            for i in self.index.get(s, ()):
                counts[i] = counts.get(i, 0) + 1
        padded = f" {norm} "
        for i, count in counts.items():
            if count >= self.containment * len(self.item_shingles[i]) or f" {self.items[i]} " in padded:
                return True
        # short evaluation items (fewer words than a shingle) are caught by containment of the whole text
        return any(len(item.split()) < self.shingle and f" {item} " in padded for item in self._short)

    @property
    def _short(self) -> list[str]:
        if not hasattr(self, "_short_items"):
            self._short_items = [t for t in self.items if len(t.split()) < self.shingle]
        return self._short_items
