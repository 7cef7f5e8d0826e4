"""Fused elementwise ops of a decoder layer: residual add + RMSNorm, SiLU-and-multiply of a fused gate|up
projection, and rotary embedding of q and k in one launch.

Each op comes as a plain-torch reference (`*_torch`, also the CPU serving path) that reproduces Hugging Face's
numerics exactly, a Triton launcher (`*_triton`) and a dispatcher that picks Triton for CUDA tensors. The kernels
compute in fp32 and round to the activation dtype wherever the torch expressions do, so 16-bit results equal the
reference bit for bit except for rare last-ulp differences from the order of a sum or from exp / rsqrt. Their grids
depend only on shapes and they never wait on the host, so they can be captured in CUDA graphs. Inputs may have any
row strides, but their last dimension must be contiguous; outputs are new contiguous tensors.
"""

import torch
import triton
import triton.language as tl

_MAX_TILE = 1024  # columns of one row handled by one silu_mul program


def _require_unit_last_stride(*tensors):
    for t in tensors:
        if t.stride(-1) != 1:
            raise ValueError(f"the last dimension must be contiguous, got strides {t.stride()}")


# --- 1. rms_norm: [residual add,] RMSNorm -----------------------------------------------------------------------


@triton.jit
def _rms_norm_kernel(
    x,
    residual,
    weight,
    out,
    residual_out,
    cols,
    eps,
    x_row,
    r_row,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Program (row): v = x [+ residual, rounded, stored to residual_out]; out = weight * round(v * rstd(v))."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    in_row = offs < cols
    v = tl.load(x + row * x_row + offs, mask=in_row, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(residual + row * r_row + offs, mask=in_row, other=0.0)
        v = (v.to(tl.float32) + r.to(tl.float32)).to(v.dtype)
        tl.store(residual_out + row * cols + offs, v, mask=in_row)
    v32 = v.to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(v32 * v32, axis=0) / cols + eps)
    normed = (v32 * rstd).to(v.dtype).to(tl.float32)
    w = tl.load(weight + offs, mask=in_row, other=0.0).to(tl.float32)
    tl.store(out + row * cols + offs, (w * normed).to(out.dtype.element_ty), mask=in_row)


def rms_norm_torch(x, weight, eps, residual=None):
    """Reference for `rms_norm`: the expressions of modeld.model.causal_lm.RMSNorm (and of `x + attn_out`)."""
    if residual is not None:
        x = x + residual
    v = x.float()
    return weight * (v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype), x


def rms_norm_triton(x, weight, eps, residual=None):
    """Triton version of `rms_norm`."""
    _require_unit_last_stride(x, x if residual is None else residual)
    rows, cols = x.shape
    out = torch.empty(rows, cols, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    residual_out = x if residual is None else torch.empty(rows, cols, dtype=x.dtype, device=x.device)
    if rows == 0:
        return out, residual_out
    block = triton.next_power_of_2(cols)
    _rms_norm_kernel[(rows,)](
        x,
        x if residual is None else residual,
        weight,
        out,
        residual_out,
        cols,
        eps,
        x.stride(0),
        0 if residual is None else residual.stride(0),
        HAS_RESIDUAL=residual is not None,
        BLOCK=block,
        num_warps=min(16, max(1, block // 256)),  # about 8 columns per thread
    )
    return out, residual_out


def rms_norm(x, weight, eps, residual=None):
    """HF's LlamaRMSNorm of x, or of x + residual: returns (out, residual_out).

    x, residual: [T, H] of one dtype (bf16, fp16 or fp32); weight: [H]; eps: float. Without residual, v = x and
    residual_out is x itself; with it, v = x + residual rounded to x.dtype, returned as residual_out (a new tensor).
    out = weight * (v32 * rsqrt(mean(v32^2) + eps)).to(v.dtype), with v32 = v.float(): statistics in fp32, the
    normalised row rounded to v.dtype, and the product with weight in the promoted dtype of the two.
    """
    return (rms_norm_triton if x.is_cuda else rms_norm_torch)(x, weight, eps, residual)


# --- 2. silu_mul: SiLU(gate) * up -------------------------------------------------------------------------------


@triton.jit
def _silu_mul_kernel(gate_up, out, cols, gu_row, TILE: tl.constexpr):
    """Program (row, tile): out = round(round(g / (1 + exp(-g))) * up), g = gate in fp32."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * TILE + tl.arange(0, TILE)
    in_row = offs < cols
    gate = tl.load(gate_up + row * gu_row + offs, mask=in_row, other=0.0)
    up = tl.load(gate_up + row * gu_row + cols + offs, mask=in_row, other=0.0)
    g = gate.to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(gate.dtype).to(tl.float32)
    tl.store(out + row * cols + offs, (act * up.to(tl.float32)).to(gate.dtype), mask=in_row)


def silu_mul_torch(gate_up):
    """Reference for `silu_mul`: `silu(gate_proj(x)) * up_proj(x)` as modeld.model.causal_lm.MLP computes it."""
    gate, up = gate_up.chunk(2, dim=-1)
    # silu on a contiguous copy: on the CPU, a strided view's row tails take a scalar exp that can differ by an ulp
    # from the vectorised one that HF's contiguous gate_proj output gets
    return torch.nn.functional.silu(gate.contiguous()) * up


def silu_mul_triton(gate_up):
    """Triton version of `silu_mul`."""
    _require_unit_last_stride(gate_up)
    rows, cols = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(rows, cols, dtype=gate_up.dtype, device=gate_up.device)
    if rows == 0:
        return out
    tile = min(triton.next_power_of_2(cols), _MAX_TILE)
    _silu_mul_kernel[(rows, triton.cdiv(cols, tile))](gate_up, out, cols, gate_up.stride(0), TILE=tile)
    return out


def silu_mul(gate_up):
    """SiLU-and-multiply of a fused gate|up projection output.

    gate_up: [T, 2 * I], gate = gate_up[:, :I], up = gate_up[:, I:]. Returns [T, I] = silu(gate) * up, with
    silu(g) = g / (1 + exp(-g)) computed in fp32 and rounded to the dtype, then the product rounded to the dtype.
    """
    return (silu_mul_triton if gate_up.is_cuda else silu_mul_torch)(gate_up)


# --- 3. rotary: q and k rotated in one launch -------------------------------------------------------------------


@triton.jit
def _rotary_kernel(
    q,
    k,
    cos,
    sin,
    q_out,
    k_out,
    q_heads,
    k_heads,
    half,
    q_tok,
    q_head,
    k_tok,
    k_head,
    cos_tok,
    sin_tok,
    BLOCK_HALF: tl.constexpr,
):
    """Program (token, head), heads numbered q's first, then k's. With halves x = [x1, x2], cos = [c1, c2] and
    sin = [s1, s2]: out = [x1 c1 - x2 s1, x2 c2 + x1 s2], every product and sum rounded to x's dtype, which is
    x * cos + rotate_half(x) * sin with rotate_half(x) = [-x2, x1] (rounding commutes with the negation)."""
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    if head < q_heads:
        src = q + token * q_tok + head * q_head
        dst = q_out + (token * q_heads + head) * (2 * half)
    else:
        src = k + token * k_tok + (head - q_heads) * k_head
        dst = k_out + (token * k_heads + head - q_heads) * (2 * half)
    d = tl.arange(0, BLOCK_HALF)
    out1, out2 = rotated_halves(src, cos + token * cos_tok, sin + token * sin_tok, d, half)
    tl.store(dst + d, out1, mask=d < half)
    tl.store(dst + half + d, out2, mask=d < half)


@triton.jit
def rotated_halves(src, cos_row, sin_row, d, half):
    """The two halves (at offsets d < half) of one head's row at src, rotated, in src's dtype (rotate_pair)."""
    in_half = d < half
    x1 = tl.load(src + d, mask=in_half, other=0.0)
    x2 = tl.load(src + half + d, mask=in_half, other=0.0)
    c1 = tl.load(cos_row + d, mask=in_half, other=0.0)
    c2 = tl.load(cos_row + half + d, mask=in_half, other=0.0)
    s1 = tl.load(sin_row + d, mask=in_half, other=0.0)
    s2 = tl.load(sin_row + half + d, mask=in_half, other=0.0)
    return rotate_pair(x1, x2, c1, c2, s1, s2)


@triton.jit
def scaled_normed(v, rstd, scale):
    """RMSNorm's output in v's dtype: v * rstd rounded to that dtype, times the norm's weight `scale`, rounded again
    (rms_norm's numerics; rstd and scale broadcast against v)."""
    normed = (v.to(tl.float32) * rstd).to(v.dtype).to(tl.float32)
    return (scale.to(tl.float32) * normed).to(v.dtype)


@triton.jit
def rotate_pair(x1, x2, c1, c2, s1, s2):
    """(x1 c1 - x2 s1, x2 c2 + x1 s2) in x1's dtype, every product and the sum rounded to that dtype as the torch
    reference rounds them; x1, x2 hold values of their dtype, cos and sin values of any float dtype."""
    dtype = x1.dtype
    x1, x2 = x1.to(tl.float32), x2.to(tl.float32)
    c1, c2, s1, s2 = c1.to(tl.float32), c2.to(tl.float32), s1.to(tl.float32), s2.to(tl.float32)
    out1 = (x1 * c1).to(dtype).to(tl.float32) - (x2 * s1).to(dtype).to(tl.float32)
    out2 = (x2 * c2).to(dtype).to(tl.float32) + (x1 * s2).to(dtype).to(tl.float32)
    return out1.to(dtype), out2.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """cat(-x[..., D/2:], x[..., :D/2]): the rotation of HF's rotary embedding."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotary_torch(q, k, cos, sin):
    """Reference for `rotary`: `x * cos + rotate_half(x) * sin` as modeld.model.causal_lm.Attention computes it."""
    cos, sin = cos[:, None, :], sin[:, None, :]
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def rotary_triton(q, k, cos, sin):
    """Triton version of `rotary`."""
    _require_unit_last_stride(q, k, cos, sin)
    tokens, q_heads, head_dim = q.shape
    k_heads = k.shape[1]
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    if tokens == 0:
        return q_out, k_out
    _rotary_kernel[(tokens, q_heads + k_heads)](
        q,
        k,
        cos,
        sin,
        q_out,
        k_out,
        q_heads,
        k_heads,
        head_dim // 2,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        cos.stride(0),
        sin.stride(0),
        BLOCK_HALF=triton.next_power_of_2(head_dim // 2),
    )
    return q_out, k_out


def rotary(q, k, cos, sin):
    """Rotary position embedding of q and k (HF's apply_rotary_pos_emb): returns (q_out, k_out).

    q: [T, Hq, D], k: [T, Hk, D] of one dtype (any token and head strides); cos, sin: [T, D] in that dtype.
    x_out = x * cos + rotate_half(x) * sin, each product rounded to the dtype, then their sum. Outputs are new
    contiguous [T, H, D] tensors.
    """
    return (rotary_triton if q.is_cuda else rotary_torch)(q, k, cos, sin)
