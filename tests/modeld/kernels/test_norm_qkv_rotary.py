"""The attention input in one launch (norm + q|k|v projection + rotary + K/V write) against the two launches it
replaces (the fused norm + projection, then rotary_store): the rotated q, the pool's rows at the slots, nothing
written for padding rows, the residual stream, one row alone equal to the same row among sixteen. On the CPU
(Triton's interpreter) in fp16 only, as tests/modeld/kernels/test_skinny_linear.py says why; on a GPU in both 16-bit
dtypes."""

import pytest
import torch

from modeld.kernels.norm_linear import norm_linear_launch
from modeld.kernels.norm_qkv_rotary import norm_qkv_rotary_launch
from modeld.kernels.rotary_store import rotary_store

EPS = 1e-5
TILE = (16, 32, 4, 2)  # (block_j, block_k, warps, stages): small, the interpreter's cost grows with it


@pytest.fixture(params=[torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def dtype(request, device):
    if device == "cpu" and request.param == torch.bfloat16:
        pytest.skip("Triton's interpreter multiplies bf16 tiles wrongly; bf16 runs on a GPU")
    return request.param


def _case(device, dtype, rows, q_heads=4, kv_heads=2, head_dim=32, k=96, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = (q_heads + 2 * kv_heads) * head_dim
    r = lambda *shape, scale=1.0: (scale * torch.randn(*shape, generator=g)).to(device, dtype)  # noqa: E731
    angles = torch.rand(rows, head_dim // 2, generator=g) * 6.28
    cos, sin = (torch.cat([f(angles)] * 2, dim=-1).to(device, dtype) for f in (torch.cos, torch.sin))
    return dict(
        x=r(rows, k),
        residual=r(rows, k),
        norm_weight=1 + r(k, scale=0.1),
        weight=r(n, k, scale=k**-0.5),
        bias=r(n) if bias else None,
        cos=cos,
        sin=sin,
        q_heads=q_heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
    )


def _pools(device, dtype, kv_heads, head_dim, rows=40):
    full = lambda: torch.full((rows, kv_heads, head_dim), float("nan"), dtype=dtype, device=device)  # noqa: E731
    return full(), full()


def _run_fused(c, residual, slots, pools):
    return norm_qkv_rotary_launch(
        c["x"],
        residual,
        c["norm_weight"],
        EPS,
        c["weight"],
        c["bias"],
        c["cos"],
        c["sin"],
        *pools,
        slots,
        c["q_heads"],
        c["kv_heads"],
        TILE,
    )


def _run_apart(c, residual, slots, pools):
    qkv, stream = norm_linear_launch(c["x"], residual, c["norm_weight"], EPS, c["weight"], c["bias"], (32, 32, 4, 2))
    hq, hk, d = c["q_heads"] * c["head_dim"], c["kv_heads"] * c["head_dim"], c["head_dim"]
    q, k, v = qkv.split((hq, hk, hk), dim=-1)
    q = rotary_store(
        q.unflatten(-1, (c["q_heads"], d)),
        k.unflatten(-1, (c["kv_heads"], d)),
        v.unflatten(-1, (c["kv_heads"], d)),
        c["cos"],
        c["sin"],
        *pools,
        slots,
    )
    return q, stream


def _within_an_ulp(got, want, dtype):
    """Equal but for rare last-ulp moves (the norm's statistics and the projection's tiles sum in other orders)."""
    got, want = got.float(), want.float()
    both_nan = got.isnan() & want.isnan()
    diff = (got - want).abs().masked_fill(both_nan, 0)
    assert (diff <= 2 * want.abs().nan_to_num(0).clamp_min(1.0) * torch.finfo(dtype).eps).all()
    assert (diff > 0).float().mean() <= 0.02


@pytest.mark.parametrize("with_residual", [True, False], ids=["add", "no_add"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("rows", [1, 5, 16, 37])
def test_equals_the_norm_projection_then_rotary_store(device, dtype, with_residual, bias, rows):
    c = _case(device, dtype, rows, bias=bias)
    residual = c["residual"] if with_residual else None
    slots = torch.randperm(40, generator=torch.Generator().manual_seed(rows))[:rows].to(device)
    if rows > 1:
        slots[1] = -1  # a padding row: its q is rotated, nothing is written
    fused_pools, apart_pools = _pools(device, dtype, 2, 32), _pools(device, dtype, 2, 32)
    q, stream = _run_fused(c, residual, slots, fused_pools)
    want_q, want_stream = _run_apart(c, residual, slots, apart_pools)
    assert q.shape == (rows, c["q_heads"], c["head_dim"]) and q.dtype == dtype
    assert torch.equal(stream, want_stream)
    if not with_residual:
        assert stream is c["x"]
    _within_an_ulp(q, want_q, dtype)
    for got, want in zip(fused_pools, apart_pools):
        _within_an_ulp(got, want, dtype)
        untouched = torch.ones(40, dtype=torch.bool, device=device)
        untouched[slots[slots >= 0]] = False
        assert got[untouched].isnan().all()  # rows of no slot, and the padding row's, are not written


def test_a_row_alone_equals_the_same_row_among_many(device, dtype):
    """Among 40 rows: three programs' blocks of 16, the last partial."""
    c = _case(device, dtype, 40, seed=3)
    slots = torch.arange(40, device=device) + 2
    block_pools = _pools(device, dtype, 2, 32, rows=64)
    q_block, _ = _run_fused(c, c["residual"], slots, block_pools)
    for i in (0, 11, 15, 16, 39):
        alone = {**c, "x": c["x"][i : i + 1], "cos": c["cos"][i : i + 1], "sin": c["sin"][i : i + 1]}
        pools = _pools(device, dtype, 2, 32, rows=64)
        q, _ = _run_fused(alone, c["residual"][i : i + 1], slots[i : i + 1], pools)
        assert torch.equal(q[0], q_block[i])
        assert torch.equal(pools[0][slots[i]], block_pools[0][slots[i]])
        assert torch.equal(pools[1][slots[i]], block_pools[1][slots[i]])


def test_shape_errors_are_clear(device):
    c = _case(device, torch.float16, 2)
    slots = torch.tensor([3, 4], device=device)
    with pytest.raises(ValueError, match="q\\|k\\|v weight of"):
        norm_qkv_rotary_launch(
            c["x"],
            None,
            c["norm_weight"],
            EPS,
            c["weight"],
            None,
            c["cos"],
            c["sin"],
            *_pools(device, torch.float16, 2, 32),
            slots,
            5,
            2,
            TILE,
        )
    with pytest.raises(ValueError, match="a cos row per row"):
        norm_qkv_rotary_launch(
            c["x"],
            None,
            c["norm_weight"],
            EPS,
            c["weight"],
            None,
            c["cos"][:1],
            c["sin"][:1],
            *_pools(device, torch.float16, 2, 32),
            slots,
            4,
            2,
            TILE,
        )
