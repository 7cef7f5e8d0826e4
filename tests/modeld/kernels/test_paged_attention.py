"""Paged attention: the Triton kernel against the torch reference, and the reference against dense SDPA.

The batch is laid out like memd's pools: req_to_token built from random page lists (page 0, the sink, never used),
caches as layer-1 views of a [layers, 2, rows, kv_heads, head_dim] pool. In the poisoned layout every cache row that
attention must not read is NaN (the sink page, positions at or beyond kv_len, positions before the first query's
window, every unmapped draft row) and so is `out`: a finite result equal to the reference shows that only the causal
window was read and every output row was written.
"""

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from modeld.kernels.attention import (
    decode_attention_torch,
    paged_attention,
    paged_attention_torch,
    paged_attention_triton,
)

LAYER = 1


@dataclass
class Case:
    q_starts: list
    q_lens: list
    page_size: int
    group: int
    kv_heads: int
    head_dim: int
    window: int | None = None
    translated: bool = False  # read the draft pool through mapping (DFLASH draft)

    @property
    def kv_lens(self):
        return [s + n for s, n in zip(self.q_starts, self.q_lens)]


CASES = {
    "decode": Case([0, 36, 69], [1, 1, 1], page_size=1, group=1, kv_heads=3, head_dim=16),
    "decode_window_gqa": Case([4, 69, 129], [1, 1, 1], page_size=64, group=3, kv_heads=1, head_dim=80, window=16),
    "decode_draft_window": Case(
        [40, 3, 92], [1, 1, 1], page_size=16, group=3, kv_heads=1, head_dim=16, window=16, translated=True
    ),
    "extend_mixed_gqa": Case([0, 50, 80], [19, 5, 1], page_size=64, group=3, kv_heads=2, head_dim=64),
    "extend_window": Case([0, 60], [19, 7], page_size=1, group=1, kv_heads=3, head_dim=16, window=8),
    "draft_window_p1": Case(
        [92, 40], [8, 1], page_size=1, group=3, kv_heads=1, head_dim=16, window=16, translated=True
    ),
    "draft_window_p64": Case(
        [130, 3], [8, 8], page_size=64, group=1, kv_heads=2, head_dim=80, window=33, translated=True
    ),
}


def first_readable(case, b):
    """First key position request b's queries may see (the first query's window start)."""
    return 0 if case.window is None else max(0, case.q_starts[b] - case.window + 1)


def int32(values, device):
    return torch.tensor(values, dtype=torch.int32, device=device)


def build(case, dtype, device, poison=True):
    """Inputs of paged_attention for `case` as a dict; with poison, unreadable cache rows and `out` are NaN."""
    torch.manual_seed(len(case.q_lens) * 1000 + sum(case.kv_lens))
    batch, size = len(case.q_lens), case.page_size
    context_len = max(case.kv_lens) + 5  # req_to_token also maps positions beyond kv_len (to NaN rows)
    pages_each = -(-context_len // size)
    num_pages = 1 + batch * pages_each
    positions = torch.arange(context_len)
    rows = 1 + torch.randperm(batch + 1)[:batch]  # request rows; row 0 and one more stay unused
    req_to_token = torch.zeros(batch + 2, context_len, dtype=torch.int32)
    for b, pages in enumerate((1 + torch.randperm(num_pages - 1)).split(pages_each)):
        req_to_token[rows[b]] = (pages[positions // size] * size + positions % size).to(torch.int32)

    # positions whose K/V the caller has written: [first readable, kv_len) (everything below kv_len without poison)
    written = [(rows[b], torch.arange(first_readable(case, b) if poison else 0, case.kv_lens[b])) for b in range(batch)]
    cache_rows, mapping = num_pages * size, None
    if case.translated:  # the draft pool holds only the written positions, at the same in-page offsets
        draft_pages = (1 + torch.randperm(num_pages - 1)).split(pages_each)
        mapping = torch.zeros(num_pages * size, dtype=torch.int32)
        for b, (row, pos) in enumerate(written):
            mapping[req_to_token[row, pos].long()] = (draft_pages[b][pos // size] * size + pos % size).to(torch.int32)
    pool_shape = (2, 2, cache_rows, case.kv_heads, case.head_dim)
    pool = torch.full(pool_shape, float("nan"), dtype=dtype) if poison else torch.randn(pool_shape).to(dtype)
    for row, pos in written:
        slots = req_to_token[row, pos].long()
        if mapping is not None:
            slots = mapping[slots].long()
        pool[LAYER, :, slots] = torch.randn(2, len(slots), case.kv_heads, case.head_dim).to(dtype)

    total_q, q_heads = sum(case.q_lens), case.kv_heads * case.group
    q = torch.randn(total_q, q_heads, case.head_dim).to(dtype)
    pool = pool.to(device)
    return dict(
        q=q.to(device),
        k_cache=pool[LAYER, 0],
        v_cache=pool[LAYER, 1],
        req_to_token=req_to_token.to(device),
        rows=rows.to(torch.int32).to(device),
        q_starts=int32(case.q_starts, device),
        q_lens=int32(case.q_lens, device),
        kv_lens=int32(case.kv_lens, device),
        sm_scale=case.head_dim**-0.5,
        window=case.window,
        mapping=None if mapping is None else mapping.to(device),
        out=torch.full_like(q, float("nan")).to(device),
    )


def run_triton_against_reference(case, dtype, device, blocks, atol, rtol):
    args = build(case, dtype, device)
    expected = paged_attention_torch(**{**args, "out": None})
    block_m, block_n = blocks
    result = paged_attention_triton(**args, block_m=block_m, block_n=block_n)
    assert result is args["out"]
    assert expected.isfinite().all()
    assert result.isfinite().all()
    torch.testing.assert_close(result, expected, atol=atol, rtol=rtol)


@pytest.mark.parametrize("blocks", [(16, 16), (64, 64)], ids=["blocks16", "blocks64"])
@pytest.mark.parametrize("name", CASES)
def test_triton_matches_reference_fp32(name, blocks, device):
    run_triton_against_reference(CASES[name], torch.float32, device, blocks, atol=1e-4, rtol=1e-4)


@pytest.mark.gpu  # on the CPU, Triton 3.9's interpreter computes tl.dot of bf16 inputs wrongly
@pytest.mark.parametrize("blocks", [(16, 16), (64, 64)], ids=["blocks16", "blocks64"])
@pytest.mark.parametrize("name", CASES)
def test_triton_matches_reference_bf16_cuda(name, blocks):
    run_triton_against_reference(CASES[name], torch.bfloat16, "cuda", blocks, atol=2e-2, rtol=2e-2)


def dense_attention(args, case):
    """Per request: all keys 0 .. kv_len-1 gathered densely, an explicit mask from the definition, then SDPA."""
    outs, qo = [], 0
    for b in range(len(case.q_lens)):
        slots = args["req_to_token"][args["rows"][b], : case.kv_lens[b]].long()
        if args["mapping"] is not None:
            slots = args["mapping"][slots].long()
        k, v = (cache[slots].transpose(0, 1) for cache in (args["k_cache"], args["v_cache"]))  # [kv_heads, keys, D]
        q = args["q"][qo : qo + case.q_lens[b]].transpose(0, 1)  # [q_heads, queries, D]
        query_pos = range(case.q_starts[b], case.kv_lens[b])
        mask = torch.tensor(
            [
                [p <= t and (case.window is None or t - p < case.window) for p in range(case.kv_lens[b])]
                for t in query_pos
            ]
        )
        outs.append(
            F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=args["sm_scale"], enable_gqa=True).transpose(
                0, 1
            )
        )
        qo += case.q_lens[b]
    return torch.cat(outs)


@pytest.mark.parametrize("name", ["extend_mixed_gqa", "extend_window", "draft_window_p64"])
def test_reference_matches_dense_sdpa(name):
    case = CASES[name]
    args = build(case, torch.float32, "cpu", poison=False)
    torch.testing.assert_close(paged_attention(**args), dense_attention(args, case), atol=1e-5, rtol=1e-5)


DECODE_CASES = [name for name, case in CASES.items() if set(case.q_lens) == {1}]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", DECODE_CASES)
def test_batched_cpu_decode_matches_reference(name, dtype):
    """The CPU's decode path (one query a request, every request in one pass) in the poisoned layout: only visible
    keys are read (a NaN row read anywhere would spread), every output row is written, and it equals the
    per-request reference; paged_attention on the CPU gives the same for such a step."""
    args = build(CASES[name], dtype, "cpu")
    expected = paged_attention_torch(**{**args, "out": None})
    batched = {
        name: args[name]
        for name in (
            "q",
            "k_cache",
            "v_cache",
            "req_to_token",
            "rows",
            "q_starts",
            "kv_lens",
            "sm_scale",
            "window",
            "mapping",
            "out",
        )
    }
    result = decode_attention_torch(**batched)
    assert result is args["out"] and result.isfinite().all()
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(result, expected, atol=tolerance, rtol=tolerance)
    torch.testing.assert_close(paged_attention(**{**args, "out": None}), expected, atol=tolerance, rtol=tolerance)
