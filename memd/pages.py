"""A free list of pages for one side (target or draft). Page 0 is the sink, never handed out."""

import numpy as np

from memd.errors import InvariantViolation


class PagePool:
    def __init__(self, num_pages: int, page_size: int, side: str):
        self.num_pages = num_pages  # usable pages, numbered 1..num_pages
        self.page_size = page_size
        self.side = side
        self._free = list(range(num_pages, 0, -1))  # pop() hands out low pages first
        self._is_free = np.ones(num_pages + 1, dtype=bool)
        self._is_free[0] = False

    @property
    def free_pages(self) -> int:
        return len(self._free)

    @property
    def free_tokens(self) -> int:
        return len(self._free) * self.page_size

    @property
    def total_tokens(self) -> int:
        return self.num_pages * self.page_size

    def alloc(self, count: int) -> list[int]:
        """`count` pages; the caller has checked that they are there."""
        assert 0 <= count <= len(self._free), (count, len(self._free))
        if count == 0:
            return []
        pages = self._free[-count:][::-1]
        del self._free[-count:]
        self._is_free[pages] = False
        return pages

    def free(self, pages: list[int]) -> None:
        """Invariant: a page returns exactly once, and page 0 never enters the free list."""
        if not pages:
            return
        arr = np.asarray(pages)
        if (
            (arr <= 0).any()
            or (arr > self.num_pages).any()
            or self._is_free[arr].any()
            or len(set(pages)) != len(pages)
        ):
            raise InvariantViolation(f"{self.side} pool: double free or bad page in {sorted(pages)[:16]}")
        self._is_free[arr] = True
        self._free.extend(pages)

    def check(self) -> None:
        if len(set(self._free)) != len(self._free):
            raise InvariantViolation(f"{self.side} pool: a page is free twice")
        if 0 in self._free or self._is_free[0]:
            raise InvariantViolation(f"{self.side} pool: the sink page 0 is on the free list")
        if int(self._is_free.sum()) != len(self._free):
            raise InvariantViolation(f"{self.side} pool: free bitmap and free list disagree")
