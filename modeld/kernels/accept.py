"""DFLASH's acceptance rule in one launch: per verified block, the length of the longest prefix of drafts
d_1..d_{B-1} that the target's tokens y_0..y_{B-2} repeat, plus the bonus token, as lengths [N] on the device.

Why: the torch expression (compare, cast, cumulative product, sum, add, and the padding mask in the cycle graph) is
five to seven launches of a few microseconds each in every verify step, where one program a block reads 2B tokens.
Nothing waits on the host and the grid depends on shapes only, so it is captured in CUDA graphs.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _accept_kernel(
    drafts, target, live, out, block, d_row, t_row, live_row, HAS_LIVE: tl.constexpr, BLOCK_B: tl.constexpr
):
    """Program (block n): the first position where draft and target differ (B - 1 if none), plus one; 0 where the
    request is padding (live < 0)."""
    n = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_B)
    inside = offs < block - 1
    d = tl.load(drafts + n * d_row + offs, mask=inside, other=0)
    t = tl.load(target + n * t_row + offs, mask=inside, other=0)
    length = tl.min(tl.where(inside & (d != t), offs, block - 1), axis=0) + 1
    if HAS_LIVE:
        length = tl.where(tl.load(live + n * live_row) >= 0, length, 0)
    tl.store(out + n, length.to(tl.int64))


def accept_lengths_torch(drafts: torch.Tensor, target: torch.Tensor, live: torch.Tensor | None = None) -> torch.Tensor:
    """The reference (and the CPU's path): `accept_lengths` in torch operations."""
    lengths = (drafts == target[:, :-1]).to(torch.int32).cumprod(dim=1).sum(dim=1) + 1
    return lengths if live is None else lengths * (live >= 0)


def accept_lengths_triton(drafts: torch.Tensor, target: torch.Tensor, live: torch.Tensor | None = None) -> torch.Tensor:
    """Triton version of `accept_lengths`."""
    n, block = target.shape
    if drafts.shape != (n, block - 1):
        raise ValueError(f"drafts {tuple(drafts.shape)} do not fit target {tuple(target.shape)}: want [N, B - 1]")
    if drafts.stride(-1) != 1 or target.stride(-1) != 1:
        raise ValueError("drafts and target must be contiguous along the block")
    out = torch.empty(n, dtype=torch.int64, device=target.device)
    if n:
        _accept_kernel[(n,)](
            drafts,
            target,
            out if live is None else live,
            out,
            block,
            drafts.stride(0),
            target.stride(0),
            0 if live is None else live.stride(0),
            HAS_LIVE=live is not None,
            BLOCK_B=max(16, triton.next_power_of_2(block)),
        )
    return out


def accept_lengths(drafts: torch.Tensor, target: torch.Tensor, live: torch.Tensor | None = None) -> torch.Tensor:
    """Tokens committed by each verified block, on the device (int64 [N]): drafts d_1..d_{B-1} [N, B-1], target tokens
    y_0..y_{B-1} [N, B] (y_i follows position L+i). The block commits the longest prefix of drafts with
    d_i == y_{i-1}, then the bonus: a + 1 tokens, which are exactly target[:, :a + 1]. With `live` [N] (a request's
    first slot in the cycle graph), a block whose live < 0 (a padding request) commits 0. One Triton launch on a GPU."""
    if target.is_cuda:
        return accept_lengths_triton(drafts, target, live)
    return accept_lengths_torch(drafts, target, live)
