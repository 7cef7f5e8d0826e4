"""Linear layers over a few rows (a batch-1 decode step, one request's DFLASH block): y = x @ W^T [+ b] in one Triton
kernel that streams W once.

Why: at one row cuBLAS runs the 8B geometry's QKV and o_proj at 66-67% of the H200's bandwidth and splits o_proj over
K, which adds a reduction kernel (BENCHMARKS.md, the 8B step profile). Here every program owns BLOCK_N
output columns of every row and walks all of K, so there is one launch and no reduction. The kernel runs only for the
weight shapes where `python -m bench.kernels.skinny_linear` measured it faster than cuBLAS (TILES); other shapes stay
on cuBLAS.

Rows are padded to 16 (the smallest tensor-core tile), so a row's result depends on W, b and that row only: one
request decoded alone gives the same logits as inside a block of 16 rows. The tile sizes depend on (N, K) only, for
the same reason. Grids depend only on shapes and nothing waits on the host, so the kernels can be captured in CUDA
graphs. Above MAX_ROWS rows, on the CPU, for other dtypes or shapes, callers get torch's linear (cuBLAS).
"""

import torch
import triton
import triton.language as tl

MAX_ROWS = 16  # one tensor-core tile of rows; more rows are a GEMM, which cuBLAS does well


@triton.jit
def _skinny_kernel(
    x,
    w,
    b,
    y,
    M,
    N,
    K,
    x_row,
    HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Program (column block, block of 16 rows): y[:, n] = x @ W[n, :]^T (+ b[n]) for BLOCK_N columns n of those
    rows (one block holds a few-row step's every row)."""
    rows = tl.program_id(1) * 16 + tl.arange(0, 16)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_in = rows < M
    col_in = cols < N
    w_rows = w + cols.to(tl.int64)[:, None] * K
    acc = tl.zeros((16, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        if EVEN_K:
            x_mask = row_in[:, None]
            w_mask = col_in[:, None]
        else:
            x_mask = row_in[:, None] & (ks < K)[None, :]
            w_mask = col_in[:, None] & (ks < K)[None, :]
        xs = tl.load(x + rows[:, None] * x_row + ks[None, :], mask=x_mask, other=0.0)
        ws = tl.load(w_rows + ks[None, :], mask=w_mask, other=0.0)
        acc += tl.dot(xs, tl.trans(ws))
    if HAS_BIAS:
        acc += tl.load(b + cols, mask=col_in, other=0.0).to(tl.float32)[None, :]
    out = y + rows[:, None] * N + cols[None, :]
    tl.store(out, acc.to(y.dtype.element_ty), mask=row_in[:, None] & col_in[None, :])


# (block_n, block_k, num_warps, num_stages) by the weight's (N, K): the fastest tile of
# `python -m bench.kernels.skinny_linear` at one row on an H100 (BENCHMARKS.md), for the shapes where it beat cuBLAS. The 8B geometry (Llama-3-8B): QKV,
# o_proj, gate|up, down; the default model (SmolLM2-135M): the same four.
TILES: dict[tuple[int, int], tuple[int, int, int, int]] = {
    (6144, 4096): (64, 256, 4, 4),
    (4096, 4096): (32, 512, 4, 3),
    (28672, 4096): (32, 512, 4, 4),
    (4096, 14336): (32, 512, 4, 3),
    (960, 576): (16, 64, 4, 5),
    (576, 576): (32, 128, 4, 5),
    (3072, 576): (32, 64, 4, 5),
    (576, 1536): (16, 512, 4, 3),
}


def fits(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `linear` runs x (rows, K) against weight (N, K) through the kernel rather than cuBLAS."""
    return (
        x.is_cuda
        and x.dim() == 2
        and 0 < x.shape[0] <= MAX_ROWS
        and x.dtype in (torch.bfloat16, torch.float16)
        and weight.dtype == x.dtype
        and weight.is_contiguous()
        and x.stride(-1) == 1
        and tuple(weight.shape) in TILES
    )


def skinny_launch(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, tile: tuple[int, int, int, int]
) -> torch.Tensor:
    """The kernel on x [M, K] and weight [N, K] with the given tile: y [M, N]. Any device Triton runs on. Any M, in
    blocks of 16 rows, each streaming W again (modeld sends at most MAX_ROWS, `fits`)."""
    rows, n, k = x.shape[0], weight.shape[0], weight.shape[1]
    if x.shape[1] != k:
        raise ValueError(f"input of {x.shape[1]} columns for a weight of {k}")
    block_n, block_k, warps, stages = tile
    y = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    if rows == 0:
        return y
    _skinny_kernel[(triton.cdiv(n, block_n), triton.cdiv(rows, 16))](
        x,
        weight,
        bias if bias is not None else weight,
        y,
        rows,
        n,
        k,
        x.stride(0),
        HAS_BIAS=bias is not None,
        EVEN_K=k % block_k == 0,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        num_warps=warps,
        num_stages=stages,
    )
    return y


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, skinny: bool = True
) -> torch.Tensor:
    """torch's linear, through the skinny kernel (while `skinny`, modeld's switch) for at most MAX_ROWS rows on a GPU
    and a weight shape in TILES."""
    if skinny and fits(x, weight):
        return skinny_launch(x, weight, bias, TILES[tuple(weight.shape)])
    return torch.nn.functional.linear(x, weight, bias)
