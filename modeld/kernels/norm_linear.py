"""A decoder layer's residual add + RMSNorm folded into the skinny projection that reads its output (q|k|v after the
input norm, gate|up after the post-attention norm), and for gate|up also the SiLU-and-multiply after it: one launch
where a few-row step ran two or three.

Why: a batch-1 decode step of the 8B geometry ran 297 kernels, nine a layer, and the two RMSNorms and the SiLU-mul
are each a few microseconds of latency for a few kilobytes of work (BENCHMARKS.md, the 8B step profile).
Here every program of the skinny projection (modeld/kernels/skinny_linear.py) first sums the squares of its rows of
v = x + residual (a few kilobytes from L2), then normalises each K chunk as it goes and multiplies it into its columns
of W. The programs of the first column block also store their rows of v, the residual stream the next layer adds to.
Measured on a GPU, that pays only where the weight is small (the default model's shapes); FUSED_TILES lists where
modeld runs it.

Numerics are those of the unfused ops (modeld/kernels/fused.py, then the skinny kernel): v rounded to the activation
dtype, statistics in fp32, the normalised row rounded, times the norm's weight rounded, then the same tile of the
same dot; SiLU on the rounded gate, rounded, times the rounded up, rounded. Only the fp32 sum of squares is taken in
another order (by K chunk), so a normalised value can differ by a last ulp. A row's result depends on that row alone.
"""

import torch
import triton
import triton.language as tl

from modeld.kernels.fused import rms_norm, scaled_normed, silu_mul
from modeld.kernels.skinny_linear import MAX_ROWS, linear
from modeld.kernels.tile_fitting import launch_fitting

# (N, K, gate|up with SiLU-mul) of a projection after a norm -> the fused kernel's tile, only for the shapes where
# `python -m bench.kernels.fused --sweep` measured the fused launch faster than the norm, skinny projection (and
# SiLU-mul) launches it replaces, at the rows modeld sends it (BENCHMARKS.md, H100): the default model's and its
# draft's gate|up, 1.17x at one row and 1.13x at 16. q|k|v alone is not here: the target's attention input takes
# the norm, q|k|v and rotary in one launch (norm_qkv_rotary), so this kernel's q|k|v served only the draft's block of
# 16 rows, where every tile of the sweep ran at best 0.90x the launches apart. The 8B geometry
# is not here: its fused tiles ran at best 0.82x (q|k|v) and 0.90x (gate|up) of the launches apart, and the 8B step
# took 7.7 ms of device time fused against 5.8 ms apart, so its norms run apart.
FUSED_TILES: dict[tuple[int, int, bool], tuple[int, int, int, int]] = {(3072, 576, True): (32, 256, 4, 3)}


@triton.jit
def _residual_sum(x, residual, rows, ks, row_in, K, x_row, r_row, HAS_RESIDUAL: tl.constexpr, EVEN_K: tl.constexpr):
    """The [16, BLOCK_K] tile of v = x (+ residual, rounded to x's dtype) at columns ks; rows past M read as 0."""
    mask = row_in[:, None] if EVEN_K else row_in[:, None] & (ks < K)[None, :]
    v = tl.load(x + rows[:, None] * x_row + ks[None, :], mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(residual + rows[:, None] * r_row + ks[None, :], mask=mask, other=0.0)
        v = (v.to(tl.float32) + r.to(tl.float32)).to(v.dtype)
    return v


@triton.jit
def _row_rstd(
    x,
    residual,
    rows,
    row_in,
    K,
    x_row,
    r_row,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """1 / RMS of each of the 16 rows of v = x (+ residual): fp32 statistics, summed by K chunk."""
    sumsq = tl.zeros((16,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        v32 = _residual_sum(
            x, residual, rows, k0 + tl.arange(0, BLOCK_K), row_in, K, x_row, r_row, HAS_RESIDUAL, EVEN_K
        ).to(tl.float32)
        sumsq += tl.sum(v32 * v32, axis=1)
    return tl.math.rsqrt(sumsq / K + eps)


@triton.jit
def _normed_tile(
    x,
    residual,
    norm_w,
    residual_out,
    rows,
    ks,
    row_in,
    rstd,
    K,
    x_row,
    r_row,
    store_residual,
    HAS_RESIDUAL: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    """The [16, BLOCK_K] tile at columns ks of h = norm_w * round(v * rstd), rounded to v's dtype; with
    store_residual (one program of a launch) also stores v to residual_out [M, K]."""
    k_in = ks < K
    v = _residual_sum(x, residual, rows, ks, row_in, K, x_row, r_row, HAS_RESIDUAL, EVEN_K)
    if HAS_RESIDUAL:
        if store_residual:
            tl.store(residual_out + rows[:, None] * K + ks[None, :], v, mask=row_in[:, None] & k_in[None, :])
    return scaled_normed(v, rstd[:, None], tl.load(norm_w + ks, mask=k_in, other=0.0)[None, :])


@triton.jit
def normed_dot_pair(
    x,
    residual,
    norm_w,
    residual_out,
    w,
    rows,
    first,
    second,
    n_in,
    M,
    K,
    x_row,
    r_row,
    eps,
    store_residual,
    PAIR: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """The product of 16 normed rows h (x's rows `rows`, zeros past M) with W's rows `first` and, with PAIR, `second`
    ([BLOCK_N] row indices each, n_in where they exist): two [16, BLOCK_N] fp32 accumulators (the second zero
    without PAIR). The program with store_residual also stores those rows of v = x (+ residual) to residual_out."""
    row_in = rows < M
    rstd = _row_rstd(x, residual, rows, row_in, K, x_row, r_row, eps, HAS_RESIDUAL, EVEN_K, BLOCK_K)
    first_rows = w + first.to(tl.int64)[:, None] * K
    second_rows = w + second.to(tl.int64)[:, None] * K
    acc1 = tl.zeros((16, BLOCK_N), dtype=tl.float32)
    acc2 = tl.zeros((16, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        h = _normed_tile(
            x,
            residual,
            norm_w,
            residual_out,
            rows,
            ks,
            row_in,
            rstd,
            K,
            x_row,
            r_row,
            store_residual,
            HAS_RESIDUAL,
            EVEN_K,
        )
        w_mask = n_in[:, None] if EVEN_K else n_in[:, None] & (ks < K)[None, :]
        acc1 += tl.dot(h, tl.trans(tl.load(first_rows + ks[None, :], mask=w_mask, other=0.0)))
        if PAIR:
            acc2 += tl.dot(h, tl.trans(tl.load(second_rows + ks[None, :], mask=w_mask, other=0.0)))
    return acc1, acc2


@triton.jit
def _norm_linear_kernel(
    x,
    residual,
    norm_w,
    w,
    b,
    y,
    residual_out,
    M,
    N,
    K,
    x_row,
    r_row,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SILU_PAIR: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Program (column block, block of 16 rows): h = norm_w * round(v * rstd(v)) rounded; y[:, n] = h @ W[n, :]^T
    (+ b[n]) for BLOCK_N columns n. With SILU_PAIR, W is gate|up [2N, K] and y[:, n] = silu(gate_n) * up_n, up_n from
    row N + n of W."""
    pid = tl.program_id(0)
    rows = tl.program_id(1) * 16 + tl.arange(0, 16)
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    col_in = cols < N
    acc, acc_up = normed_dot_pair(
        x,
        residual,
        norm_w,
        residual_out,
        w,
        rows,
        cols,
        cols + N,
        col_in,
        M,
        K,
        x_row,
        r_row,
        eps,
        pid == 0,
        SILU_PAIR,
        HAS_RESIDUAL,
        EVEN_K,
        BLOCK_N,
        BLOCK_K,
    )
    if HAS_BIAS:
        acc += tl.load(b + cols, mask=col_in, other=0.0).to(tl.float32)[None, :]
        if SILU_PAIR:
            acc_up += tl.load(b + N + cols, mask=col_in, other=0.0).to(tl.float32)[None, :]
    if SILU_PAIR:
        gate = acc.to(y.dtype.element_ty).to(tl.float32)
        act = (gate / (1.0 + tl.exp(-gate))).to(y.dtype.element_ty).to(tl.float32)
        acc = act * acc_up.to(y.dtype.element_ty).to(tl.float32)
    out = y + rows[:, None] * N + cols[None, :]
    tl.store(out, acc.to(y.dtype.element_ty), mask=(rows < M)[:, None] & col_in[None, :])


def fits_inputs(x: torch.Tensor, norm_weight: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the fused kernels (this one and norm_qkv_rotary) take x [rows, K] with this norm weight and
    projection weight: a few rows on a GPU, half precision, one dtype for all three, contiguous rows. Each kernel
    also needs the weight's shape in its table of measured tiles."""
    return (
        x.is_cuda
        and x.dim() == 2
        and 0 < x.shape[0] <= MAX_ROWS
        and x.dtype in (torch.bfloat16, torch.float16)
        and weight.dtype == x.dtype
        and norm_weight.dtype == x.dtype
        and weight.is_contiguous()
        and x.stride(-1) == 1
    )


def fits(x: torch.Tensor, norm_weight: torch.Tensor, weight: torch.Tensor, silu_pair: bool = False) -> bool:
    """Whether `norm_linear` takes x with this norm and projection (`fits_inputs`, a shape in FUSED_TILES);
    otherwise the caller runs the norm and the projection apart."""
    return fits_inputs(x, norm_weight, weight) and (*weight.shape, silu_pair) in FUSED_TILES


def norm_linear_launch(x, residual, norm_weight, eps, weight, bias, tile, silu_pair=False):
    """The kernel: (y, v) with v = x (+ residual) and y = linear(rms_norm(v) * norm_weight, weight, bias), or with
    silu_pair, y = silu_mul of that (weight is gate|up [2I, K], y [rows, I]). v is x itself without residual. Any
    number of rows, in blocks of 16 (each block streams W again: modeld sends at most MAX_ROWS, `fits`)."""
    rows, k = x.shape
    if weight.shape[1] != k or norm_weight.shape != (k,):
        raise ValueError(
            f"input of {k} columns for a norm of {tuple(norm_weight.shape)} and a weight of {weight.shape[1]}"
        )
    if residual is not None and (residual.shape != x.shape or residual.stride(-1) != 1):
        raise ValueError(f"residual of shape {tuple(residual.shape)} for an input of {tuple(x.shape)}")
    n = weight.shape[0] // 2 if silu_pair else weight.shape[0]
    block_n, block_k, warps, stages = tile
    y = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    # residual_out: the residual stream after this add, each row written once (first column block); without an add, x
    residual_out = x if residual is None else torch.empty(rows, k, dtype=x.dtype, device=x.device)
    if rows == 0:
        return y, residual_out
    _norm_linear_kernel[(triton.cdiv(n, block_n), triton.cdiv(rows, 16))](
        x,
        x if residual is None else residual,
        norm_weight,
        weight,
        weight if bias is None else bias,
        y,
        residual_out,
        rows,
        n,
        k,
        x.stride(0),
        0 if residual is None else residual.stride(0),
        eps,
        HAS_RESIDUAL=residual is not None,
        HAS_BIAS=bias is not None,
        SILU_PAIR=silu_pair,
        EVEN_K=k % block_k == 0,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        num_warps=warps,
        num_stages=stages,
    )
    return y, residual_out


def fitting_key(weight: torch.Tensor, silu_pair: bool, has_residual: bool) -> tuple:
    """The kernel variant launch_fitting keeps a tile for (tile_fitting.tile_in_use reads it back)."""
    return ("norm_linear", *weight.shape, silu_pair, has_residual)


def norm_linear(x, residual, norm_weight, eps, weight, bias, silu_pair=False):
    """(y, v) as `norm_linear_launch` computes them, with the shape's tile from FUSED_TILES (fewer stages where the
    card needs), or None where no tile fits (launch_fitting). Callers check `fits`."""
    return launch_fitting(
        fitting_key(weight, silu_pair, residual is not None),
        FUSED_TILES[(*weight.shape, silu_pair)],
        lambda tile: norm_linear_launch(x, residual, norm_weight, eps, weight, bias, tile, silu_pair),
    )


def norm_project(x, residual, norm_weight, eps, weight, bias, silu=False, skinny=True, fuse=True):
    """(proj(norm(x + residual)), x + residual), then SiLU-mul with silu: one launch of the fused kernel where it
    fits (fuse and skinny on, a few rows on a GPU, a shape in FUSED_TILES, a tile within shared memory), else the norm
    kernel, the projection (the skinny kernel where it fits while skinny is on, else cuBLAS) and the SiLU-mul
    kernel. The target's decoder layers and the DFLASH draft's serving layers both run their norms through this."""
    if skinny and fuse and fits(x, norm_weight, weight, silu):
        fused = norm_linear(x, residual, norm_weight, eps, weight, bias, silu_pair=silu)
        if fused is not None:
            return fused
    h, residual = rms_norm(x, norm_weight, eps, residual)
    out = linear(h, weight, bias, skinny)
    return (silu_mul(out) if silu else out), residual
