"""The draft block's attention read straight from the draft pool (modeld.kernels.draft_attention: the Triton kernel
of PagedContext) against the torch path (the context gathered out of the pool, then the mask and
masked_attention the draft module uses): sliding and full-attention layers, contexts shorter and longer than the
window, positions without a draft slot, causal and bidirectional blocks, GQA groups, pool rows outside every context
holding NaN."""

import pytest
import torch

from modeld.kernels.draft_attention import PagedContext, draft_attention, draft_attention_paged_triton

CASES = [  # (starts L per request, block, heads, kv_heads, head_dim, window)
    ([300, 5, 40], 16, 9, 3, 64, 256),  # one context past the window, one shorter than a tile
    ([70, 1], 8, 4, 4, 80, 32),  # no grouping; a head_dim that is not a power of two
    ([90, 17, 130], 4, 8, 2, 32, None),  # full attention: every position before L
]
CONTEXT_LEN = 400


def case(starts, block, heads, kv_heads, head_dim, window, dtype, device):
    """A draft pool [2 layers, 2, rows, kv_heads, head_dim] (layer 1 read) that is NaN except where the mapping
    points; req_to_token rows 1.. of the requests; a mapping that leaves every seventh position without a draft
    slot; q a contiguous block, k and v views of a wider projection (the serving path's layout)."""
    gen = torch.Generator().manual_seed(sum(starts) + block)
    n = len(starts)
    target_rows = 1 + n * CONTEXT_LEN
    req_to_token = torch.zeros(n + 1, CONTEXT_LEN, dtype=torch.int32)
    req_to_token[1:] = 1 + torch.randperm(target_rows - 1, generator=gen)[: n * CONTEXT_LEN].view(n, CONTEXT_LEN).int()
    mapping = torch.zeros(target_rows, dtype=torch.int32)
    mapped = torch.randperm(target_rows - 1, generator=gen)[: target_rows // 2] + 1  # half the target slots
    mapping[mapped] = 1 + torch.randperm(len(mapped), generator=gen).int()
    for r in range(1, n + 1):  # every seventh position of a request has no draft slot; the rest have one
        for p in range(CONTEXT_LEN):
            slot = req_to_token[r, p]
            if p % 7 == 3:
                mapping[slot] = 0
            elif mapping[slot] == 0:
                mapping[slot] = 1 + len(mapped) + r * CONTEXT_LEN + p
    draft_rows = int(mapping.max()) + 1
    pool = torch.full((2, 2, draft_rows, kv_heads, head_dim), float("nan"))
    used = mapping[req_to_token[1:].long()].long().flatten()
    pool[:, :, used[used > 0]] = torch.randn(2, 2, int((used > 0).sum()), kv_heads, head_dim, generator=gen)
    pool[:, :, 0] = float("nan")  # the sink row
    width = (window - 1) if window is not None else max(starts)
    ctx = PagedContext(
        pool[1, 0].to(dtype).to(device),
        pool[1, 1].to(dtype).to(device),
        req_to_token.to(device),
        mapping.to(device),
        torch.arange(1, n + 1).to(device),
        torch.tensor(starts).to(device),
        window,
        width,
    )
    qkv = torch.randn(n, block, (heads + 2 * kv_heads) * head_dim, generator=gen).to(dtype).to(device)
    q = qkv[..., : heads * head_dim].unflatten(-1, (heads, head_dim)).contiguous()
    k = qkv[..., heads * head_dim : (heads + kv_heads) * head_dim].unflatten(-1, (kv_heads, head_dim))
    v = qkv[..., (heads + kv_heads) * head_dim :].unflatten(-1, (kv_heads, head_dim))
    return q, k, v, ctx


def gathered_reference(q, k, v, ctx, causal, scale):
    return draft_attention(q, k, v, *ctx.gathered(q.shape[1]), causal, scale)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("shape", CASES, ids=str)
def test_kernel_matches_the_gathered_torch_path_in_fp32(shape, causal, device):
    q, k, v, ctx = case(*shape, torch.float32, device)
    got = draft_attention_paged_triton(q, k, v, ctx, causal, 0.125)
    assert not got.isnan().any()  # NaN rows of the pool are never read
    torch.testing.assert_close(got, gathered_reference(q, k, v, ctx, causal, 0.125), atol=2e-5, rtol=2e-5)


def test_the_gathered_context_is_the_window_before_the_block():
    """The torch path's gather: request 0 (L 300, window 256) sees positions 45..299 but those without a draft
    slot; its last query (position 315) sees only those within the window of it."""
    q, k, v, ctx = case([300, 5], 16, 9, 3, 64, 256, torch.float32, "cpu")
    ctx_k, _, visible = ctx.gathered(16)
    assert ctx_k.shape[1] == 255
    positions = torch.arange(45, 300)
    there = positions % 7 != 3
    assert torch.equal(visible[0, 0], there)
    assert torch.equal(visible[0, 15], there & (315 - positions < 256))
    assert not visible[1, :, 5:].any() and torch.equal(visible[1, 0, :5], torch.arange(5) % 7 != 3)
    assert not ctx_k.isnan().any()


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("shape", CASES, ids=str)
def test_kernel_matches_the_gathered_torch_path_in_bf16_on_the_gpu(shape, causal):
    q, k, v, ctx = case(*shape, torch.bfloat16, "cuda")
    got = draft_attention_paged_triton(q, k, v, ctx, causal, 0.125)
    want = gathered_reference(q, k, v, ctx, causal, 0.125)
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)


def test_attend_dispatches_by_device(device):
    q, k, v, ctx = case([40, 9], 8, 4, 2, 32, 16, torch.float32, device)
    want = (draft_attention_paged_triton if device == "cuda" else gathered_reference)(q, k, v, ctx, True, 0.2)
    assert torch.equal(ctx.attend(q, k, v, True, 0.2), want)
