"""The argmax of each row of logits [rows, vocab] in two launches: every program finds the largest value of one
block of a row and its first index, then one program per row picks the largest of its blocks' (the first index
among equals).

Why: torch's argmax over the 8B geometry's 128,256 logits of one row took 36 µs of a 4.7 ms step (BENCHMARKS.md, the
8B step profile), far above the time to read them; greedy decode, DFLASH verify and the draft's proposals
each take one a step. Here the first launch spreads a row over vocab / BLOCK programs: 4-9x torch's at one row
on an H100 (bench.kernels.fused, BENCHMARKS.md).

The answer is torch.argmax's: the first index of the largest value, NaN counted larger than any number (the first
NaN, or +inf before it, where a row has both: either way a row of garbage). Grids depend only on shapes and nothing
waits on the host, so the kernels can be captured in CUDA graphs.
"""

import torch
import triton
import triton.language as tl

BLOCK = 4096  # logits a program of the first launch reads


@triton.jit
def _block_argmax_kernel(x, part_value, part_index, vocab, x_row, blocks, BLOCK: tl.constexpr):
    """Program (row, block): the largest value of the block (NaN as +inf) and its first index."""
    row = tl.program_id(0).to(tl.int64)
    block = tl.program_id(1)
    offs = block * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x + row * x_row + offs, mask=offs < vocab, other=-float("inf")).to(tl.float32)
    v = tl.where(v != v, float("inf"), v)
    top = tl.max(v, axis=0)
    first = tl.min(tl.where((v == top) & (offs < vocab), offs, vocab), axis=0)
    tl.store(part_value + row * blocks + block, top)
    tl.store(part_index + row * blocks + block, first)


@triton.jit
def _row_argmax_kernel(part_value, part_index, out, vocab, blocks, BLOCK_P: tl.constexpr):
    """Program (row): the first index of the largest of the row's block maxima."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_P)
    v = tl.load(part_value + row * blocks + offs, mask=offs < blocks, other=-float("inf"))
    i = tl.load(part_index + row * blocks + offs, mask=offs < blocks, other=vocab)
    top = tl.max(v, axis=0)
    first = tl.min(tl.where(v == top, i, vocab), axis=0)
    tl.store(out + row, tl.minimum(first, vocab - 1).to(tl.int64))  # a guard: never an index past the vocab


def argmax_triton(logits: torch.Tensor) -> torch.Tensor:
    """Triton version of `argmax_rows`."""
    rows, vocab = logits.shape
    if logits.stride(-1) != 1:
        raise ValueError(f"the vocab dimension must be contiguous, got strides {logits.stride()}")
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    if rows == 0:
        return out
    blocks = triton.cdiv(vocab, BLOCK)
    part_value = torch.empty(rows, blocks, dtype=torch.float32, device=logits.device)
    part_index = torch.empty(rows, blocks, dtype=torch.int32, device=logits.device)
    _block_argmax_kernel[(rows, blocks)](
        logits, part_value, part_index, vocab, logits.stride(0), blocks, BLOCK=BLOCK, num_warps=8
    )
    _row_argmax_kernel[(rows,)](
        part_value, part_index, out, vocab, blocks, BLOCK_P=max(16, triton.next_power_of_2(blocks))
    )
    return out


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """torch.argmax(logits, dim=-1) of logits [..., vocab] (int64 [...]), through the two Triton launches on a GPU."""
    if not logits.is_cuda:
        return logits.argmax(dim=-1)
    return argmax_triton(logits.reshape(-1, logits.shape[-1])).view(logits.shape[:-1])
