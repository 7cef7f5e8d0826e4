"""The one-launch acceptance rule against its torch reference (and, through it, the host rule of
tests/modeld/runner/test_device_sampling.py): block sizes around the tile's, nothing and everything accepted, rows that are
views of wider tensors, padding requests (live < 0) committing nothing, no blocks, and misshapen inputs refused."""

import pytest
import torch

from modeld.kernels.accept import accept_lengths, accept_lengths_torch, accept_lengths_triton


def blocks(n: int, block: int, seed: int, match: float = 0.8) -> tuple[torch.Tensor, torch.Tensor]:
    """drafts [n, block - 1] that repeat target [n, block]'s tokens with probability `match` each (a vocabulary of 4:
    long accepted prefixes happen, and so do chance matches after a miss)."""
    gen = torch.Generator().manual_seed(seed)
    target = torch.randint(0, 4, (n, block), generator=gen)
    drafts = torch.where(
        torch.rand(n, block - 1, generator=gen) < match,
        target[:, :-1],
        torch.randint(0, 4, (n, block - 1), generator=gen),
    )
    return drafts, target


@pytest.mark.parametrize("block", [2, 8, 16, 17])
def test_equals_the_torch_rule(device, block):
    drafts, target = blocks(300, block, seed=block)
    want = accept_lengths_torch(drafts, target)
    assert {1, block} <= set(want.tolist()), "the cases never covered nothing accepted and everything accepted"
    got = accept_lengths_triton(drafts.to(device), target.to(device))
    assert got.dtype == torch.int64 and torch.equal(got.cpu(), want)


def test_a_miss_ends_the_prefix_even_when_later_drafts_match(device):
    target = torch.tensor([[5, 6, 7, 8, 9], [5, 6, 7, 8, 9], [5, 6, 7, 8, 9], [5, 6, 7, 8, 9]])
    drafts = torch.tensor([[5, 6, 7, 8], [1, 6, 7, 8], [5, 6, 1, 8], [5, 6, 7, 1]])
    assert accept_lengths_triton(drafts.to(device), target.to(device)).tolist() == [5, 1, 3, 4]


def test_rows_of_wider_tensors(device):
    drafts, target = blocks(40, 16, seed=3)
    wide_target = torch.zeros(40, 24, dtype=target.dtype)
    wide_target[:, 4:20] = target
    wide_drafts = torch.zeros(40, 20, dtype=drafts.dtype)
    wide_drafts[:, 2:17] = drafts
    got = accept_lengths_triton(wide_drafts[:, 2:17].to(device), wide_target[:, 4:20].to(device))
    assert torch.equal(got.cpu(), accept_lengths_torch(drafts, target))


def test_padding_requests_commit_nothing(device):
    drafts, target = blocks(64, 16, seed=4)
    slots = torch.randint(1, 1000, (64, 16))
    slots[::3] = -1  # the cycle graph's padding requests: slot -1 everywhere
    live = slots[:, 0]  # a strided view, as the cycle graph passes it
    want = accept_lengths_torch(drafts, target, live)
    assert want[::3].eq(0).all() and want[1::3].ge(1).all()
    got = accept_lengths_triton(drafts.to(device), target.to(device), live.to(device))
    assert torch.equal(got.cpu(), want)


def test_no_blocks(device):
    got = accept_lengths_triton(
        torch.empty(0, 15, dtype=torch.int64, device=device), torch.empty(0, 16, dtype=torch.int64, device=device)
    )
    assert got.shape == (0,) and got.dtype == torch.int64


def test_misshapen_inputs_are_refused(device):
    drafts, target = blocks(4, 8, seed=5)
    with pytest.raises(ValueError, match="want \\[N, B - 1\\]"):
        accept_lengths_triton(drafts[:, :-1].to(device), target.to(device))
    with pytest.raises(ValueError, match="contiguous"):
        accept_lengths_triton(drafts.t().contiguous().t().to(device), target.to(device))


def test_the_cpu_takes_the_torch_path():
    drafts, target = blocks(50, 16, seed=6)
    live = torch.where(torch.arange(50) % 4 == 0, -1, 7)
    assert torch.equal(accept_lengths(drafts, target, live), accept_lengths_torch(drafts, target, live))
