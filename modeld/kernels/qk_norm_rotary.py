"""Qwen3's per-head RMSNorm of q and k followed by rotary embedding, in one launch: what rms_norm on q, rms_norm on k
and rotary (modeld/kernels/fused.py) compute, with two launches fewer a layer. The DFLASH draft's layers (Qwen3)
run it on their block every propose, and its context keys of every layer at once (k's heads in groups, one norm
weight a group: a layer's) every step that commits tokens.

Numerics are those of the three launches: a head's statistics in fp32, the normalised row rounded, times the
norm's weight rounded, then rotary's products and sums each rounded (fused.rotate_pair). The sum of squares is
taken over the head's two halves, so it may differ from rms_norm's by a last ulp.
"""

import torch
import triton
import triton.language as tl

from modeld.kernels.fused import _require_unit_last_stride, rms_norm_torch, rotary_torch, rotate_pair, scaled_normed


@triton.jit
def _qk_norm_rotary_kernel(
    q,
    k,
    q_weight,
    k_weight,
    cos,
    sin,
    q_out,
    k_out,
    q_heads,
    k_heads,
    half,
    eps,
    q_tok,
    q_head,
    k_tok,
    k_head,
    cos_tok,
    sin_tok,
    k_weight_row,
    k_heads_a_weight,
    BLOCK_HALF: tl.constexpr,
):
    """Program (token, head), heads numbered q's first, then k's: the head's row normed with its weight (q's, or
    the row of k's weights of the head's group), then rotated; stored to a contiguous [T, H, D] output."""
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    if head < q_heads:
        src = q + token * q_tok + head * q_head
        weight = q_weight
        dst = q_out + (token * q_heads + head) * (2 * half)
    else:
        src = k + token * k_tok + (head - q_heads) * k_head
        weight = k_weight + ((head - q_heads) // k_heads_a_weight) * k_weight_row
        dst = k_out + (token * k_heads + head - q_heads) * (2 * half)
    d = tl.arange(0, BLOCK_HALF)
    in_half = d < half
    x1 = tl.load(src + d, mask=in_half, other=0.0)
    x2 = tl.load(src + half + d, mask=in_half, other=0.0)
    a, b = x1.to(tl.float32), x2.to(tl.float32)
    rstd = tl.math.rsqrt((tl.sum(a * a, axis=0) + tl.sum(b * b, axis=0)) / (2 * half) + eps)
    n1 = scaled_normed(x1, rstd, tl.load(weight + d, mask=in_half, other=0.0))
    n2 = scaled_normed(x2, rstd, tl.load(weight + half + d, mask=in_half, other=0.0))
    cos_row, sin_row = cos + token * cos_tok, sin + token * sin_tok
    out1, out2 = rotate_pair(
        n1,
        n2,
        tl.load(cos_row + d, mask=in_half, other=0.0),
        tl.load(cos_row + half + d, mask=in_half, other=0.0),
        tl.load(sin_row + d, mask=in_half, other=0.0),
        tl.load(sin_row + half + d, mask=in_half, other=0.0),
    )
    tl.store(dst + d, out1, mask=in_half)
    tl.store(dst + half + d, out2, mask=in_half)


def _head_norm_torch(x, weight, eps):
    """rms_norm_torch of every head's row of x [T, H, D], with weight [D] or one row of weight [G, D] for each of G
    equal groups of heads."""
    if weight.dim() == 2:
        weight = weight.repeat_interleave(x.shape[1] // weight.shape[0], dim=0)
    return rms_norm_torch(x, weight, eps)[0]


def qk_norm_rotary_torch(q, k, q_weight, k_weight, eps, cos, sin):
    """Reference for `qk_norm_rotary`: rms_norm of every head's row of q and of k, then rotary."""
    return rotary_torch(_head_norm_torch(q, q_weight, eps), _head_norm_torch(k, k_weight, eps), cos, sin)


def qk_norm_rotary_triton(q, k, q_weight, k_weight, eps, cos, sin):
    """Triton version of `qk_norm_rotary`."""
    _require_unit_last_stride(q, k, cos, sin)
    tokens, q_heads, head_dim = q.shape
    k_heads = k.shape[1]
    if q_weight.dtype != q.dtype or k_weight.dtype != k.dtype:  # rms_norm would promote: keep its path
        return qk_norm_rotary_torch(q, k, q_weight, k_weight, eps, cos, sin)
    groups = k_weight.shape[0] if k_weight.dim() == 2 else 1
    if k_heads % groups or k_weight.stride(-1) != 1:
        raise ValueError(f"{k_heads} k heads in {groups} groups of weights of strides {k_weight.stride()}")
    q_out = torch.empty(tokens, q_heads, head_dim, dtype=q.dtype, device=q.device)
    k_out = torch.empty(tokens, k_heads, head_dim, dtype=k.dtype, device=k.device)
    if tokens == 0:
        return q_out, k_out
    _qk_norm_rotary_kernel[(tokens, q_heads + k_heads)](
        q,
        k,
        q_weight,
        k_weight,
        cos,
        sin,
        q_out,
        k_out,
        q_heads,
        k_heads,
        head_dim // 2,
        eps,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        cos.stride(0),
        sin.stride(0),
        k_weight.stride(0) if groups > 1 else 0,
        k_heads // groups,
        BLOCK_HALF=triton.next_power_of_2(head_dim // 2),
    )
    return q_out, k_out


def qk_norm_rotary(q, k, q_weight, k_weight, eps, cos, sin):
    """(rotary(rms_norm(q) * q_weight), rotary(rms_norm(k) * k_weight)) per head: q [T, Hq, D], k [T, Hk, D] of one
    dtype (any token and head strides, unit last stride; q may have no heads); q_weight [D]; k_weight [D], or
    [G, D] for G equal groups of k's heads, a row each; cos, sin [T, D] in that dtype. Returns new contiguous
    [T, H, D] tensors."""
    return (qk_norm_rotary_triton if q.is_cuda else qk_norm_rotary_torch)(q, k, q_weight, k_weight, eps, cos, sin)
