"""In-process paged pools for model tests: a KV buffer, a req_to_token table and scattered pages,
laid out exactly as memd lays them out (page 0 is the sink and never used)."""

import torch

from modeld.model.causal_lm import ForwardBatch


class PagedPools:
    def __init__(
        self,
        cfg,
        *,
        pages: int,
        page_size: int,
        max_requests: int = 4,
        context: int = 512,
        dtype=torch.float32,
        seed: int = 0,
    ):
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        rows = (pages + 1) * page_size
        self.P = page_size
        self.kv = torch.full(
            (cfg.num_hidden_layers, 2, rows, cfg.num_key_value_heads, head_dim), float("nan"), dtype=dtype
        )
        self.req_to_token = torch.zeros(max_requests + 1, context, dtype=torch.int32)
        gen = torch.Generator().manual_seed(seed)
        self.free_pages = (torch.randperm(pages, generator=gen) + 1).tolist()  # scattered, never page 0
        self.pages: dict[int, list[int]] = {}
        self.lengths: dict[int, int] = {}

    def grow(self, row: int, n: int) -> list[int]:
        """Slots for the next n positions of the request in `row`."""
        pages = self.pages.setdefault(row, [])
        start = self.lengths.get(row, 0)
        slots = []
        for pos in range(start, start + n):
            if pos // self.P >= len(pages):
                pages.append(self.free_pages.pop())
            slots.append(pages[pos // self.P] * self.P + pos % self.P)
        self.req_to_token[row, start : start + n] = torch.tensor(slots, dtype=torch.int32)
        self.lengths[row] = start + n
        return slots

    def batch(self, parts: list[tuple[int, list[int]]]) -> ForwardBatch:
        """parts: (row, new token ids) per request, in batch order."""
        ids, positions, slots, starts, lens = [], [], [], [], []
        for row, tokens in parts:
            start = self.lengths.get(row, 0)
            slots += self.grow(row, len(tokens))
            ids += tokens
            positions += range(start, start + len(tokens))
            starts.append(start)
            lens.append(len(tokens))
        t = lambda v: torch.tensor(v, dtype=torch.int64)  # noqa: E731
        return ForwardBatch(
            t(ids),
            t(positions),
            t(slots),
            t([r for r, _ in parts]),
            t(starts),
            t(lens),
            t([s + n for s, n in zip(starts, lens)]),
            self.req_to_token,
        )
