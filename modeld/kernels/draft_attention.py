"""The DFLASH draft block's attention (one layer): each of a request's B block queries attends to the context K/V
gathered from the draft pool (the positions a mask marks visible) and to the block's own B keys (all of them, or
those at or before the query when the draft is causal). The block's K/V never enter the pool.

One launch per layer replaces what the torch path runs: the concatenation of context and block K/V, the repeat of
K/V heads over each query group, the boolean mask, and scaled-dot-product attention (a CUDA graph's host launch
time grows with its kernels; cuDNN's attention also built a plan per new shape).
"""

import torch
import triton
import triton.language as tl
from torch.nn.attention import SDPBackend, sdpa_kernel

# The torch path's attention never runs on cuDNN, which builds a plan for every new shape (about 19 ms of host
# time each on the H200, bench.step_profile): the memory-efficient kernel takes the block mask and builds nothing;
# flash (no masks) and math stay for what it refuses (the CPU: math). On the GPU, serving runs the Triton kernel
# below; the draft module (training) runs this path.
DRAFT_ATTENTION_BACKENDS = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor, scale: float) -> torch.Tensor:
    """Scaled dot-product attention of q [N, heads, Q, d] over k, v [N, heads, K, d] where visible [N, 1, Q, K]."""
    with sdpa_kernel(DRAFT_ATTENTION_BACKENDS):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=scale)


def draft_attention_torch(q, k, v, ctx_k, ctx_v, ctx_visible, causal: bool, scale: float):
    """Reference for `draft_attention`, and the draft module's own attention (differentiable): the mask
    [N, 1, B, C + B], the context and block K/V concatenated with their heads repeated per group, masked_attention."""
    n, b, heads, _ = q.shape
    groups = heads // k.shape[2]
    block = torch.ones(b, b, dtype=torch.bool, device=q.device)
    if causal:
        block = block.tril()
    visible = torch.cat([ctx_visible, block.expand(n, b, b)], dim=-1)[:, None]
    keys = torch.cat([ctx_k, k], dim=1).repeat_interleave(groups, dim=2)
    values = torch.cat([ctx_v, v], dim=1).repeat_interleave(groups, dim=2)
    out = masked_attention(q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2), visible, scale)
    return out.transpose(1, 2)


@triton.jit
def _attend(q_tile, k_tile, v_tile, visible, m_i, l_i, acc, scale, DOT_PRECISION: tl.constexpr):
    """One online-softmax step of a tile of queries over a tile of keys ([BLOCK_D, keys]) and values ([keys, BLOCK_D])."""
    scores = tl.dot(q_tile, k_tile, input_precision=DOT_PRECISION) * scale
    scores = tl.where(visible, scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that saw no key yet: keep exp() finite
    p = tl.exp(scores - m_safe[:, None])
    alpha = tl.exp(m_i - m_safe)
    acc = acc * alpha[:, None] + tl.dot(p.to(v_tile.dtype), v_tile, input_precision=DOT_PRECISION)
    return m_new, l_i * alpha + tl.sum(p, 1), acc


@triton.jit
def _draft_attention_kernel(
    q, k, v, ctx_k, ctx_v, visible, out, block, context, head_dim, scale,
    q_n, q_tok, q_head, k_n, k_tok, k_head, v_n, v_tok, v_head,
    ck_n, ck_pos, ck_head, cv_n, cv_pos, cv_head, vis_n, vis_q, o_n, o_tok, o_head,
    GROUP: tl.constexpr, CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_B: tl.constexpr,
):
    """Program (request n, kv head): the tile's rows are (query i, head g of the kv head's group) pairs, row =
    i * GROUP + g, so each K/V tile is loaded once per group. Online softmax over the context in BLOCK_N tiles,
    then over the block's own keys. Context K/V rows a query does not see are never read into its sum (their
    values load as 0 where no query of the tile sees them)."""
    n = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    tile_row = tl.arange(0, BLOCK_M)
    query = tile_row // GROUP
    head = kv_head * GROUP + tile_row % GROUP
    row_ok = query < block
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < head_dim
    q_tile = tl.load(q + n * q_n + query[:, None] * q_tok + head[:, None] * q_head + dims[None, :],
                     mask=row_ok[:, None] & dim_ok[None, :], other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start in range(0, context, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        pos_ok = pos < context
        seen = tl.load(visible + n * vis_n + query[:, None] * vis_q + pos[None, :],
                       mask=row_ok[:, None] & pos_ok[None, :], other=0) != 0
        any_seen = tl.max(seen.to(tl.int32), 0) > 0  # [BLOCK_N]: a row some query of the tile sees
        k_tile = tl.load(ctx_k + n * ck_n + pos[None, :] * ck_pos + kv_head * ck_head + dims[:, None],
                         mask=any_seen[None, :] & dim_ok[:, None], other=0.0)
        v_tile = tl.load(ctx_v + n * cv_n + pos[:, None] * cv_pos + kv_head * cv_head + dims[None, :],
                         mask=any_seen[:, None] & dim_ok[None, :], other=0.0)
        m_i, l_i, acc = _attend(q_tile, k_tile, v_tile, seen, m_i, l_i, acc, scale, DOT_PRECISION)

    keys = tl.arange(0, BLOCK_B)
    key_ok = keys < block
    k_tile = tl.load(k + n * k_n + keys[None, :] * k_tok + kv_head * k_head + dims[:, None],
                     mask=key_ok[None, :] & dim_ok[:, None], other=0.0)
    v_tile = tl.load(v + n * v_n + keys[:, None] * v_tok + kv_head * v_head + dims[None, :],
                     mask=key_ok[:, None] & dim_ok[None, :], other=0.0)
    seen = row_ok[:, None] & key_ok[None, :]
    if CAUSAL:
        seen = seen & (keys[None, :] <= query[:, None])
    m_i, l_i, acc = _attend(q_tile, k_tile, v_tile, seen, m_i, l_i, acc, scale, DOT_PRECISION)

    l_i = tl.where(row_ok, l_i, 1.0)  # padding rows of the tile saw no key; they are not stored
    o_ptrs = out + n * o_n + query[:, None] * o_tok + head[:, None] * o_head + dims[None, :]
    tl.store(o_ptrs, (acc / l_i[:, None]).to(out.dtype.element_ty), mask=row_ok[:, None] & dim_ok[None, :])


def draft_attention_triton(q, k, v, ctx_k, ctx_v, ctx_visible, causal: bool, scale: float, block_n: int = 64):
    """Triton version of `draft_attention`."""
    for t in (q, k, v, ctx_k, ctx_v, ctx_visible):
        if t.stride(-1) != 1:
            raise ValueError(f"the last dimension must be contiguous, got strides {t.stride()}")
    n, b, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    group = heads // kv_heads
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    visible = ctx_visible.view(torch.uint8) if ctx_visible.dtype == torch.bool else ctx_visible
    block_b = max(16, triton.next_power_of_2(b))
    _draft_attention_kernel[(n, kv_heads)](
        q, k, v, ctx_k, ctx_v, visible, out, b, ctx_k.shape[1], head_dim, scale,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
        ctx_k.stride(0), ctx_k.stride(1), ctx_k.stride(2), ctx_v.stride(0), ctx_v.stride(1), ctx_v.stride(2),
        visible.stride(0), visible.stride(1), out.stride(0), out.stride(1), out.stride(2),
        GROUP=group, CAUSAL=causal, DOT_PRECISION="ieee" if q.dtype == torch.float32 else None,  # no tf32 for fp32
        BLOCK_M=max(16, triton.next_power_of_2(b * group)), BLOCK_N=block_n,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)), BLOCK_B=block_b,
    )
    return out


def draft_attention(q, k, v, ctx_k, ctx_v, ctx_visible, causal: bool, scale: float):
    """Attention of a draft block: q [N, B, heads, D] over the context ctx_k, ctx_v [N, C, kv_heads, D] where
    ctx_visible [N, B, C] (bool) and over the block's own k, v [N, B, kv_heads, D] (every key, or keys at or before
    the query when causal). Returns [N, B, heads, D] in q's dtype. Triton on CUDA tensors, torch otherwise."""
    fn = draft_attention_triton if q.is_cuda else draft_attention_torch
    return fn(q, k, v, ctx_k, ctx_v, ctx_visible, causal, scale)
