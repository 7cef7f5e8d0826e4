"""A decoder layer's attention input in one launch for a few rows: the residual add + RMSNorm, the q|k|v projection,
rotary embedding of q and k, and the write of the rotated k and of v into the paged pool. It replaces, for the layers
without a q/k norm (Llama, Qwen2: the default model and the 8B geometry), the fused norm + projection launch of
modeld/kernels/norm_linear.py followed by modeld/kernels/rotary_store.py.

Each program owns one head and a block of j < head_dim / 2: it multiplies the normed rows into W's rows
head * D + j and head * D + D/2 + j (two accumulators, the two halves rotary mixes), rounds them as the projection's
output is rounded, then rotates them (q and k heads; fused.rotate_pair, the numerics of rotary_store) and stores q to
its output, k and v to the pool at each row's slot (a slot < 0, a padding row, writes nothing). Numerics are those of
the two launches it replaces; the norm's statistics as in norm_linear. A row's result depends on that row alone.
"""

import torch
import triton
import triton.language as tl

import modeld.kernels.norm_linear as fused_norm
from modeld.kernels.fused import rotate_pair
from modeld.kernels.norm_linear import normed_dot_pair
from modeld.kernels.tile_fitting import launch_fitting

# q|k|v weight shape (N, K) -> (BLOCK_J, BLOCK_K, warps, stages), only where the one launch was measured faster than
# the norm, skinny q|k|v and rotary_store launches it replaces (`python -m bench.kernels.fused --sweep`, H100,
# BENCHMARKS.md): the default model's, 1.14x at one row with this tile. The 8B geometry's ran at best 0.97x, so it
# runs them apart.
ATTENTION_TILES: dict[tuple[int, int], tuple[int, int, int, int]] = {(960, 576): (32, 256, 4, 3)}


@triton.jit
def _norm_qkv_rotary_kernel(
    x,
    residual,
    norm_w,
    w,
    b,
    cos,
    sin,
    q_out,
    k_cache,
    v_cache,
    slots,
    residual_out,
    M,
    K,
    eps,
    x_row,
    r_row,
    cos_row,
    sin_row,
    q_heads,
    kv_heads,
    kc_tok,
    kc_head,
    kc_dim,
    vc_tok,
    vc_head,
    vc_dim,
    HALF: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_J: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Program (head, j block, block of 16 rows), heads numbered q's, then k's, then v's, as W's rows are."""
    head = tl.program_id(0)
    rows = tl.program_id(2) * 16 + tl.arange(0, 16)
    row_in = rows < M
    j = tl.program_id(1) * BLOCK_J + tl.arange(0, BLOCK_J)
    j_in = j < HALF
    first = head * (2 * HALF) + j  # W's rows of the head's first half; the second half's are HALF further
    acc1, acc2 = normed_dot_pair(
        x,
        residual,
        norm_w,
        residual_out,
        w,
        rows,
        first,
        first + HALF,
        j_in,
        M,
        K,
        x_row,
        r_row,
        eps,
        (head == 0) & (tl.program_id(1) == 0),
        True,
        HAS_RESIDUAL,
        EVEN_K,
        BLOCK_J,
        BLOCK_K,
    )
    if HAS_BIAS:
        acc1 += tl.load(b + first, mask=j_in, other=0.0).to(tl.float32)[None, :]
        acc2 += tl.load(b + first + HALF, mask=j_in, other=0.0).to(tl.float32)[None, :]
    x1 = acc1.to(q_out.dtype.element_ty)  # the projection's output, rounded
    x2 = acc2.to(q_out.dtype.element_ty)
    mask = row_in[:, None] & j_in[None, :]
    if head < q_heads + kv_heads:
        c_at = cos + rows[:, None] * cos_row + j[None, :]
        s_at = sin + rows[:, None] * sin_row + j[None, :]
        x1, x2 = rotate_pair(
            x1,
            x2,
            tl.load(c_at, mask=mask, other=0.0),
            tl.load(c_at + HALF, mask=mask, other=0.0),
            tl.load(s_at, mask=mask, other=0.0),
            tl.load(s_at + HALF, mask=mask, other=0.0),
        )
    if head < q_heads:
        q_at = q_out + (rows[:, None] * q_heads + head) * (2 * HALF) + j[None, :]
        tl.store(q_at, x1, mask=mask)
        tl.store(q_at + HALF, x2, mask=mask)
    else:
        slot = tl.load(slots + rows, mask=row_in, other=-1).to(tl.int64)
        written = mask & (slot >= 0)[:, None]
        if head < q_heads + kv_heads:  # (each branch names its own pointer: the caches may differ in dtype)
            k_at = k_cache + slot[:, None] * kc_tok + (head - q_heads) * kc_head + j[None, :] * kc_dim
            tl.store(k_at, x1, mask=written)
            tl.store(k_at + HALF * kc_dim, x2, mask=written)
        else:
            v_at = v_cache + slot[:, None] * vc_tok + (head - q_heads - kv_heads) * vc_head + j[None, :] * vc_dim
            tl.store(v_at, x1, mask=written)
            tl.store(v_at + HALF * vc_dim, x2, mask=written)


def norm_qkv_rotary_launch(
    x, residual, norm_weight, eps, weight, bias, cos, sin, k_cache, v_cache, slots, q_heads: int, kv_heads: int, tile
):
    """The kernel: (q, v) with v = x (+ residual), q [rows, q_heads, D] the rotated q of
    linear(rms_norm(v) * norm_weight, weight, bias), and the rotated k and v of the same projection written to
    k_cache, v_cache [pool rows, kv_heads, D] at slots (rows with a slot < 0 write nothing). v is x itself without
    residual. cos, sin: [rows, D] of the rows' positions, as rotary_store takes them. Any number of rows, in blocks
    of 16 (each block streams W again: modeld sends at most MAX_ROWS, norm_linear.fits_inputs)."""
    rows, k = x.shape
    head_dim = weight.shape[0] // (q_heads + 2 * kv_heads)
    if weight.shape != ((q_heads + 2 * kv_heads) * head_dim, k) or norm_weight.shape != (k,):
        raise ValueError(
            f"a q|k|v weight of {tuple(weight.shape)} and a norm of {tuple(norm_weight.shape)} for "
            f"{q_heads} + 2 x {kv_heads} heads and an input of {k} columns"
        )
    if head_dim % 2 or cos.shape != (rows, head_dim) or sin.shape != cos.shape:
        raise ValueError(
            f"head_dim {head_dim}, cos / sin {tuple(cos.shape)} / {tuple(sin.shape)} for {rows} rows: "
            f"the fused attention input takes even heads and a cos row per row"
        )
    if residual is not None and (residual.shape != x.shape or residual.stride(-1) != 1):
        raise ValueError(f"residual of shape {tuple(residual.shape)} for an input of {tuple(x.shape)}")
    if cos.stride(-1) != 1 or sin.stride(-1) != 1:
        raise ValueError("cos and sin need a contiguous last dimension")
    block_j, block_k, warps, stages = tile
    q = torch.empty(rows, q_heads, head_dim, dtype=x.dtype, device=x.device)
    # residual_out: the residual stream after this add, each row written once (head 0, j block 0); without an add, x
    residual_out = x if residual is None else torch.empty(rows, k, dtype=x.dtype, device=x.device)
    if rows == 0:
        return q, residual_out
    _norm_qkv_rotary_kernel[(q_heads + 2 * kv_heads, triton.cdiv(head_dim // 2, block_j), triton.cdiv(rows, 16))](
        x,
        x if residual is None else residual,
        norm_weight,
        weight,
        weight if bias is None else bias,
        cos,
        sin,
        q,
        k_cache,
        v_cache,
        slots,
        residual_out,
        rows,
        k,
        eps,
        x.stride(0),
        0 if residual is None else residual.stride(0),
        cos.stride(0),
        sin.stride(0),
        q_heads,
        kv_heads,
        *k_cache.stride(),
        *v_cache.stride(),
        HALF=head_dim // 2,
        HAS_RESIDUAL=residual is not None,
        HAS_BIAS=bias is not None,
        EVEN_K=k % block_k == 0,
        BLOCK_J=block_j,
        BLOCK_K=block_k,
        num_warps=warps,
        num_stages=stages,
    )
    return q, residual_out


def norm_qkv_rotary(
    x, residual, norm_weight, eps, weight, bias, cos, sin, k_cache, v_cache, slots, q_heads: int, kv_heads: int
):
    """(q, v) as `norm_qkv_rotary_launch` computes them where the fused kernels take x and the weight
    (`norm_linear.fits_inputs`, a shape in ATTENTION_TILES) and a tile fits the card; else None, and the caller runs
    the norm + projection and rotary_store apart."""
    tile = ATTENTION_TILES.get(tuple(weight.shape))
    if (
        tile is None
        or not fused_norm.fits_inputs(x, norm_weight, weight)
        or cos.dtype != x.dtype
        or sin.dtype != x.dtype
    ):
        return None
    return launch_fitting(
        ("norm_qkv_rotary", *weight.shape, residual is not None),
        tile,
        lambda fitted: norm_qkv_rotary_launch(
            x, residual, norm_weight, eps, weight, bias, cos, sin, k_cache, v_cache, slots, q_heads, kv_heads, fitted
        ),
    )
