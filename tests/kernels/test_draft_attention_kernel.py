"""The draft block's attention kernel (modeld.kernels.draft_attention) against its torch reference (the mask and
masked_attention the draft module uses): contexts that each query sees a different part of, none of, or all of;
causal and bidirectional blocks; GQA groups; strided inputs as the serving path passes them."""

import pytest
import torch

from modeld.kernels.draft_attention import draft_attention, draft_attention_torch, draft_attention_triton

CASES = [  # (requests, block, heads, kv_heads, head_dim, context)
    (1, 16, 9, 3, 64, 255),
    (3, 16, 9, 3, 64, 40),
    (2, 8, 4, 4, 80, 70),  # no grouping; a head_dim that is not a power of two
    (5, 4, 8, 2, 32, 0),  # no context: the block alone
]


def case(n, b, heads, kv_heads, head_dim, context, dtype, device, sliding=True):
    """q as a view of a wider projection (the serving path's layout), block k/v non-contiguous views, a context
    mask that is valid positions (request 0: none) and, when sliding, a per-query window edge."""
    gen = torch.Generator().manual_seed(n * 100 + context)
    width = (heads + 2 * kv_heads) * head_dim
    qkv = torch.randn(n, b, width, generator=gen).to(dtype).to(device)
    q = qkv[..., : heads * head_dim].unflatten(-1, (heads, head_dim)).contiguous()
    k = qkv[..., heads * head_dim : (heads + kv_heads) * head_dim].unflatten(-1, (kv_heads, head_dim))
    v = qkv[..., (heads + kv_heads) * head_dim :].unflatten(-1, (kv_heads, head_dim))
    ctx_k = torch.randn(n, context, kv_heads, head_dim, generator=gen).to(dtype).to(device)
    ctx_v = torch.randn(n, context, kv_heads, head_dim, generator=gen).to(dtype).to(device)
    valid_len = torch.randint(0, context + 1, (n,), generator=gen)
    valid_len[0] = 0
    pos = torch.arange(context)
    visible = (pos[None, None, :] < valid_len[:, None, None]).expand(n, b, context)
    if sliding:  # query i sees the context from i on: the window moving with the query
        visible = visible & (pos[None, None, :] >= torch.arange(b)[None, :, None])
    return q, k, v, ctx_k, ctx_v, visible.to(device)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("shape", CASES, ids=str)
def test_kernel_matches_the_reference_in_fp32(shape, causal, device):
    q, k, v, ctx_k, ctx_v, visible = case(*shape, torch.float32, device)
    got = draft_attention_triton(q, k, v, ctx_k, ctx_v, visible, causal, 0.125)
    want = draft_attention_torch(q, k, v, ctx_k, ctx_v, visible, causal, 0.125)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)


def test_an_expanded_mask_and_unseen_garbage(device):
    """The serving path's mask is an expand (stride 0 over queries); context rows nobody sees may hold NaN."""
    q, k, v, ctx_k, ctx_v, visible = case(2, 16, 9, 3, 64, 100, torch.float32, device, sliding=False)
    expanded = visible[:, :1].expand_as(visible)
    assert expanded.stride(1) == 0
    ctx_v = ctx_v.clone()
    ctx_v[~expanded[:, 0]] = float("nan")
    ctx_k = ctx_k.clone()
    ctx_k[~expanded[:, 0]] = float("nan")
    got = draft_attention_triton(q, k, v, ctx_k, ctx_v, expanded, False, 0.125)
    assert not got.isnan().any()
    clean_k, clean_v = (torch.where(expanded[:, 0, :, None, None], t, 0) for t in (ctx_k, ctx_v))
    torch.testing.assert_close(got, draft_attention_torch(q, k, v, clean_k, clean_v, expanded, False, 0.125),
                               atol=2e-5, rtol=2e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("shape", CASES, ids=str)
def test_kernel_matches_the_reference_in_bf16_on_the_gpu(shape, causal):
    q, k, v, ctx_k, ctx_v, visible = case(*shape, torch.bfloat16, "cuda")
    got = draft_attention_triton(q, k, v, ctx_k, ctx_v, visible, causal, 0.125)
    want = draft_attention_torch(q, k, v, ctx_k, ctx_v, visible, causal, 0.125)
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)


def test_dispatch(device):
    q, k, v, ctx_k, ctx_v, visible = case(2, 8, 4, 2, 32, 20, torch.float32, device)
    impl = draft_attention_triton if device == "cuda" else draft_attention_torch
    assert torch.equal(draft_attention(q, k, v, ctx_k, ctx_v, visible, True, 0.2),
                       impl(q, k, v, ctx_k, ctx_v, visible, True, 0.2))
