"""The two-launch argmax against torch.argmax: random rows of several widths and dtypes, ties inside a block and
across blocks (the first index wins), rows of -inf, NaN, a 3-D input, and the CPU path."""

import pytest
import torch

from modeld.kernels.argmax import BLOCK, argmax_rows, argmax_triton


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows,vocab", [(1, 49152), (3, 1000), (16, BLOCK * 2 + 17)])
def test_equals_torch_argmax(device, dtype, rows, vocab):
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(vocab)).to(device, dtype)
    assert torch.equal(argmax_triton(logits), logits.argmax(dim=-1))


def test_ties_give_the_first_index(device):
    vocab = 3 * BLOCK
    logits = torch.zeros(4, vocab, device=device)
    logits[0, [5, 9]] = 2.0  # inside one block
    logits[1, [BLOCK + 3, 2 * BLOCK + 1]] = 2.0  # across blocks
    logits[2, [2 * BLOCK + 1, BLOCK + 3]] = 2.0  # the same, set in the other order
    logits[3] = 1.0  # every value equal
    assert argmax_triton(logits).tolist() == [5, BLOCK + 3, BLOCK + 3, 0]
    assert torch.equal(argmax_triton(logits), logits.argmax(dim=-1))


def test_minus_infinity_and_nan_rows_answer_as_torch(device):
    vocab = BLOCK + 100
    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(1)).to(device)
    logits[0] = float("-inf")
    logits[1, BLOCK + 50] = float("nan")  # NaN counts as the largest
    logits[2, :BLOCK] = float("-inf")  # the answer in the last, partial block
    got = argmax_triton(logits)
    assert torch.equal(got, logits.argmax(dim=-1))
    assert got[0] == 0 and got[1] == BLOCK + 50 and BLOCK <= got[2] < vocab


def test_any_leading_shape(device):
    logits = torch.randn(2, 5, 300, generator=torch.Generator().manual_seed(2)).to(device)
    if device == "cuda":
        assert torch.equal(argmax_rows(logits), logits.argmax(dim=-1))
    assert argmax_triton(logits.reshape(10, 300)).view(2, 5).tolist() == logits.argmax(dim=-1).tolist()
    assert argmax_triton(logits[:0, 0]).shape == (0,)


def test_the_cpu_path_is_torchs():
    logits = torch.randn(3, 50)
    assert torch.equal(argmax_rows(logits), logits.argmax(dim=-1))
