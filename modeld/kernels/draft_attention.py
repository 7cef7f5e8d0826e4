"""The DFLASH draft block's attention (one layer): each of a request's B block queries attends to the context K/V
gathered from the draft pool (the positions a mask marks visible) and to the block's own B keys (all of them, or
those at or before the query when the draft is causal). The block's K/V never enter the pool.

One launch per layer replaces what the torch path runs: the concatenation of context and block K/V, the repeat of
K/V heads over each query group, the boolean mask, and scaled-dot-product attention (a CUDA graph's host launch
time grows with its kernels; cuDNN's attention also built a plan per new shape). The paged form reads the context
straight from the draft pool (position -> target slot -> draft slot, as modeld.kernels.attention does with a
mapping), so serving gathers nothing: no context slots, visibility mask or K/V copy per step.
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch.nn.attention import SDPBackend, sdpa_kernel

# The torch path's attention never runs on cuDNN, which builds a plan for every new shape (about 19 ms of host
# time each on the H200, bench.engine.step_profile): the memory-efficient kernel takes the block mask and builds
# nothing; flash (no masks) and math stay for what it refuses (the CPU: math). On the GPU, serving runs the Triton kernel
# below; the draft module (training) runs this path.
DRAFT_ATTENTION_BACKENDS = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]


def masked_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor, scale: float
) -> torch.Tensor:
    """Scaled dot-product attention of q [N, heads, Q, d] over k, v [N, heads, K, d] where visible [N, 1, Q, K]."""
    with sdpa_kernel(DRAFT_ATTENTION_BACKENDS):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=scale)


def context_slots(req_to_token, mapping, rows, starts, window: int | None, width: int, block: int):
    """The draft slots of the `width` context positions a block at positions starts .. starts + block - 1 may see
    (width >= every request's L - first), whether each is there, and which each query sees: all positions before L
    (full attention), or those within `window` of the query (HF sliding semantics: query t sees p when t - p <
    window). Unmapped positions (draft slot 0) are never seen. Returns slots [N, C] (0 where not there), valid
    [N, C], visible [N, block, C]."""
    first = starts - window + 1 if window is not None else torch.zeros_like(starts)
    pos = first.clamp(min=0)[:, None] + torch.arange(width, device=rows.device)  # [N, C]
    valid = pos < starts[:, None]
    safe = torch.where(valid, pos, torch.zeros_like(pos))
    slots = mapping[req_to_token[rows[:, None], safe].long()].long()
    valid &= slots > 0
    visible = valid[:, None, :].expand(-1, block, -1)
    if window is not None:
        queries = starts[:, None] + torch.arange(block, device=rows.device)
        visible = visible & (queries[:, :, None] - pos[:, None, :] < window)
    return torch.where(valid, slots, torch.zeros_like(slots)), valid, visible


def draft_attention(q, k, v, ctx_k, ctx_v, ctx_visible, causal: bool, scale: float):
    """Attention of a draft block over a gathered context (the draft module's, differentiable; the torch path):
    q [N, B, heads, D] over ctx_k, ctx_v [N, C, kv_heads, D] where ctx_visible [N, B, C], and over the block's own
    k, v [N, B, kv_heads, D] (every key, or keys at or before the query when causal). Returns [N, B, heads, D]."""
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
    """One online-softmax step of a tile of queries over a tile of keys ([BLOCK_D, keys]) and values ([keys,
    BLOCK_D])."""
    scores = tl.dot(q_tile, k_tile, input_precision=DOT_PRECISION) * scale
    scores = tl.where(visible, scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that saw no key yet: keep exp() finite
    p = tl.exp(scores - m_safe[:, None])
    alpha = tl.exp(m_i - m_safe)
    acc = acc * alpha[:, None] + tl.dot(p.to(v_tile.dtype), v_tile, input_precision=DOT_PRECISION)
    return m_new, l_i * alpha + tl.sum(p, 1), acc


@triton.jit
def _draft_attention_paged_kernel(
    q,
    k,
    v,
    pool_k,
    pool_v,
    req_to_token,
    mapping,
    rows,
    starts,
    out,
    block,
    window,
    head_dim,
    scale,
    q_n,
    q_tok,
    q_head,
    k_n,
    k_tok,
    k_head,
    v_n,
    v_tok,
    v_head,
    pk_tok,
    pk_head,
    pv_tok,
    pv_head,
    r2t_row,
    o_n,
    o_tok,
    o_head,
    GROUP: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_B: tl.constexpr,
):
    """Program (request n, kv head): the tile's rows are (query i, head g of the kv head's group) pairs, row =
    i * GROUP + g, so each K/V tile is loaded once per group. Online softmax over the context positions
    [first, L) in BLOCK_N tiles (first = L - window + 1, at least 0, or 0 without a window), each read at draft slot
    mapping[req_to_token[row, p]] (0: not there, never read), then over the block's own keys."""
    n = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    req_row = tl.load(rows + n).to(tl.int64)
    start = tl.load(starts + n)
    first = 0
    if HAS_WINDOW:
        first = tl.maximum(start - window + 1, 0)
    tile_row = tl.arange(0, BLOCK_M)
    query = tile_row // GROUP
    head = kv_head * GROUP + tile_row % GROUP
    row_ok = query < block
    query_pos = start + query
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < head_dim
    q_tile = tl.load(
        q + n * q_n + query[:, None] * q_tok + head[:, None] * q_head + dims[None, :],
        mask=row_ok[:, None] & dim_ok[None, :],
        other=0.0,
    )

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for tile_start in range(first, start, BLOCK_N):
        pos = tile_start + tl.arange(0, BLOCK_N)
        pos_ok = pos < start
        slot = tl.load(req_to_token + req_row * r2t_row + pos, mask=pos_ok, other=0).to(tl.int64)
        slot = tl.load(mapping + slot, mask=pos_ok, other=0).to(tl.int64)
        there = pos_ok & (slot > 0)
        seen = row_ok[:, None] & there[None, :]
        if HAS_WINDOW:
            seen = seen & (query_pos[:, None] - pos[None, :] < window)
        k_tile = tl.load(
            pool_k + slot[None, :] * pk_tok + kv_head * pk_head + dims[:, None],
            mask=there[None, :] & dim_ok[:, None],
            other=0.0,
        )
        v_tile = tl.load(
            pool_v + slot[:, None] * pv_tok + kv_head * pv_head + dims[None, :],
            mask=there[:, None] & dim_ok[None, :],
            other=0.0,
        )
        m_i, l_i, acc = _attend(q_tile, k_tile, v_tile, seen, m_i, l_i, acc, scale, DOT_PRECISION)

    keys = tl.arange(0, BLOCK_B)
    key_ok = keys < block
    k_tile = tl.load(
        k + n * k_n + keys[None, :] * k_tok + kv_head * k_head + dims[:, None],
        mask=key_ok[None, :] & dim_ok[:, None],
        other=0.0,
    )
    v_tile = tl.load(
        v + n * v_n + keys[:, None] * v_tok + kv_head * v_head + dims[None, :],
        mask=key_ok[:, None] & dim_ok[None, :],
        other=0.0,
    )
    seen = row_ok[:, None] & key_ok[None, :]
    if CAUSAL:
        seen = seen & (keys[None, :] <= query[:, None])
    m_i, l_i, acc = _attend(q_tile, k_tile, v_tile, seen, m_i, l_i, acc, scale, DOT_PRECISION)

    l_i = tl.where(row_ok, l_i, 1.0)  # padding rows of the tile saw no key; they are not stored
    o_ptrs = out + n * o_n + query[:, None] * o_tok + head[:, None] * o_head + dims[None, :]
    tl.store(o_ptrs, (acc / l_i[:, None]).to(out.dtype.element_ty), mask=row_ok[:, None] & dim_ok[None, :])


@dataclass(frozen=True)
class PagedContext:
    """A draft layer's context as it lies in the draft pool: request n's block (L = starts[n]) sees positions
    before L, within `window` of each query when the layer slides. `width` (window - 1, or at least the largest L
    without a window) sizes the torch path's gather; the Triton kernel reads each request's own range."""

    pool_k: torch.Tensor  # [draft rows, kv_heads, D]: the layer's K (any strides, unit last)
    pool_v: torch.Tensor
    req_to_token: torch.Tensor  # [requests + 1, context_len] int32: position -> target slot
    mapping: torch.Tensor  # [target rows] int32: target slot -> draft slot (0: none)
    rows: torch.Tensor  # [N] rows of req_to_token
    starts: torch.Tensor  # [N] L
    window: int | None
    width: int

    def gathered(self, block: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(ctx_k, ctx_v, visible) for `draft_attention`: the context copied out of the pool, rows not there zeroed."""
        slots, valid, visible = context_slots(
            self.req_to_token, self.mapping, self.rows, self.starts, self.window, self.width, block
        )
        ctx_k, ctx_v = (torch.where(valid[:, :, None, None], pool[slots], 0) for pool in (self.pool_k, self.pool_v))
        return ctx_k, ctx_v, visible

    def attend(self, q, k, v, causal: bool, scale: float) -> torch.Tensor:
        """`draft_attention` of the block (q [N, B, heads, D], its own k, v [N, B, kv_heads, D]) over this context:
        the Triton kernel on CUDA tensors, the gather and the torch path otherwise."""
        if q.is_cuda:
            return draft_attention_paged_triton(q, k, v, self, causal, scale)
        return draft_attention(q, k, v, *self.gathered(q.shape[1]), causal, scale)


def draft_attention_paged_triton(q, k, v, ctx: PagedContext, causal: bool, scale: float, block_n: int = 64):
    """Triton version of `PagedContext.attend`."""
    for t in (q, k, v, ctx.pool_k, ctx.pool_v):
        if t.stride(-1) != 1:
            raise ValueError(f"the last dimension must be contiguous, got strides {t.stride()}")
    n, b, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    group = heads // kv_heads
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    _draft_attention_paged_kernel[(n, kv_heads)](
        q,
        k,
        v,
        ctx.pool_k,
        ctx.pool_v,
        ctx.req_to_token,
        ctx.mapping,
        ctx.rows,
        ctx.starts,
        out,
        b,
        ctx.window or 0,
        head_dim,
        scale,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k.stride(0),
        k.stride(1),
        k.stride(2),
        v.stride(0),
        v.stride(1),
        v.stride(2),
        ctx.pool_k.stride(0),
        ctx.pool_k.stride(1),
        ctx.pool_v.stride(0),
        ctx.pool_v.stride(1),
        ctx.req_to_token.stride(0),
        out.stride(0),
        out.stride(1),
        out.stride(2),
        GROUP=group,
        CAUSAL=causal,
        HAS_WINDOW=ctx.window is not None,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else None,  # no tf32 for fp32
        BLOCK_M=max(16, triton.next_power_of_2(b * group)),
        BLOCK_N=block_n,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_B=max(16, triton.next_power_of_2(b)),
    )
    return out
