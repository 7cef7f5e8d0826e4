"""The skinny linear kernel against torch: values, bias, uneven K, one row equal to the same row inside 16, and
torch's linear for what it does not take. On the CPU (Triton's interpreter) in fp16 only:
the interpreter's tl.dot gives garbage for bf16 operands; on a GPU in both 16-bit dtypes."""

import pytest
import torch

from modeld.kernels.skinny_linear import MAX_ROWS, TILES, fits, linear, skinny_launch

TILES_UNDER_TEST = [(16, 64, 4, 2), (32, 32, 4, 3)]  # small tiles: the interpreter's cost grows with them


@pytest.fixture(params=[torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def dtype(request, device):
    if device == "cpu" and request.param == torch.bfloat16:
        pytest.skip("Triton's interpreter multiplies bf16 tiles wrongly; bf16 runs on a GPU")
    return request.param


def _inputs(device, rows, n, k, seed=0, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g).to(device, dtype)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(device, dtype)
    b = torch.randn(n, generator=g).to(device, dtype)
    return x, w, b


@pytest.mark.parametrize("tile", TILES_UNDER_TEST)
@pytest.mark.parametrize("rows,n,k", [(1, 48, 128), (5, 40, 96), (16, 64, 160), (37, 40, 96)])
def test_values_match_an_fp32_product(device, dtype, tile, rows, n, k):
    x, w, b = _inputs(device, rows, n, k, dtype=dtype)
    out = skinny_launch(x, w, b, tile)
    expected = x.float() @ w.float().T + b.float()
    assert out.shape == (rows, n) and out.dtype == dtype
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=2e-2)  # one bf16 rounding of the fp32 sum


@pytest.mark.parametrize("tile", TILES_UNDER_TEST)
def test_a_row_alone_equals_the_same_row_among_many(device, dtype, tile):
    """Among 16 rows (one program's block) and among 40 (three blocks, the last partial)."""
    x, w, _ = _inputs(device, 40, 56, 192, dtype=dtype)
    block = skinny_launch(x, w, None, tile)
    assert torch.equal(skinny_launch(x[:MAX_ROWS], w, None, tile), block[:MAX_ROWS])
    for i in (0, 7, 15, 16, 39):
        alone = skinny_launch(x[i : i + 1], w, None, tile)
        assert torch.equal(alone[0], block[i])


def test_shape_errors_are_clear(device):
    x, w, _ = _inputs(device, 2, 32, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="input of 32 columns for a weight of 64"):
        skinny_launch(x[:, :32], w, None, TILES_UNDER_TEST[0])


def test_torch_takes_what_the_kernel_does_not():
    x, w, b = _inputs("cpu", 2, 32, 64)
    assert not fits(x, w)  # CPU tensors
    assert torch.equal(linear(x, w, b), torch.nn.functional.linear(x, w, b))


@pytest.mark.gpu
def test_on_the_gpu_a_tuned_shape_of_up_to_sixteen_rows_goes_through_the_kernel():
    (n, k), tile = next(iter(TILES.items()))
    x, w, b = _inputs("cuda", MAX_ROWS + 1, n, k)
    assert fits(x[:MAX_ROWS], w) and not fits(x, w) and not fits(x[:1].float(), w.float())
    assert not fits(x[:1, :64], w[:32, :64].contiguous())  # a shape not in TILES
    assert torch.equal(linear(x[:1], w, b), skinny_launch(x[:1], w, b, tile))
    torch.testing.assert_close(
        linear(x[:MAX_ROWS], w, b), torch.nn.functional.linear(x[:MAX_ROWS], w, b), atol=2e-2, rtol=2e-2
    )
