"""rotary_store (one launch) against the rotary kernel then the K/V write: the same rotated q and the same pool, bit
for bit,
padding rows writing nothing; and against the torch reference, within rotary's rounding tolerance."""

import pytest
import torch

from modeld.kernels.fused import rotary_triton
from modeld.kernels.kv_write import store_kv_torch
from modeld.kernels.rotary_store import rotary_store, rotary_store_torch, rotary_store_triton

SENTINEL = -7.0
SHAPES = [  # (tokens, q_heads, kv_heads, head_dim)
    (1, 9, 3, 64),
    (7, 4, 2, 80),  # a partly masked half
    (17, 32, 8, 128),
]


def inputs(tokens, q_heads, kv_heads, head_dim, dtype, device, cache_dtype=None):
    """q, k, v: views of one fused qkv output (as the model's); cos, sin of random positions; a sentinel-filled pool
    [2 layers, 2, rows, kv_heads, head_dim] whose layer 1 is written; slots distinct, every third one -1."""
    torch.manual_seed(tokens * q_heads + head_dim)
    qkv = torch.randn(tokens, (q_heads + 2 * kv_heads) * head_dim).to(dtype).to(device)
    q = qkv[:, : q_heads * head_dim].view(tokens, q_heads, head_dim)
    k = qkv[:, q_heads * head_dim : (q_heads + kv_heads) * head_dim].view(tokens, kv_heads, head_dim)
    v = qkv[:, (q_heads + kv_heads) * head_dim :].view(tokens, kv_heads, head_dim)
    positions = torch.randint(0, 4096, (tokens,)).float()
    inv_freq = 1.0 / 10000 ** (torch.arange(0, head_dim, 2).float() / head_dim)
    angles = torch.cat([positions[:, None] * inv_freq] * 2, dim=-1)
    cos, sin = angles.cos().to(dtype).to(device), angles.sin().to(dtype).to(device)
    rows = 8 + 2 * tokens
    pool = torch.full((2, 2, rows, kv_heads, head_dim), SENTINEL, dtype=cache_dtype or dtype, device=device)
    slots = 1 + torch.randperm(rows - 1)[:tokens]
    slots[::3] = -1
    return q, k, v, cos, sin, pool, slots.to(device)


def skip_interpreted_bf16(dtype, device):
    if dtype is torch.bfloat16 and device == "cpu":
        pytest.skip(
            "Triton's interpreter truncates fp32 -> bf16 casts (the torch comparison would fail for that alone)"
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_one_launch_equals_rotary_then_the_kv_write(shape, dtype, device):
    q, k, v, cos, sin, pool, slots = inputs(*shape, dtype, device)
    two = pool.clone()
    q_two, k_two = rotary_triton(q, k, cos, sin)
    store_kv_torch(two[1, 0], two[1, 1], slots, k_two, v)  # an exact copy of the rotated k and of v

    q_one = rotary_store_triton(q, k, v, cos, sin, pool[1, 0], pool[1, 1], slots)

    assert q_one.is_contiguous() and torch.equal(q_one, q_two)
    assert torch.equal(pool, two)
    written = slots[slots >= 0]
    untouched = torch.ones(pool.shape[2], dtype=torch.bool, device=pool.device)
    untouched[written] = False
    assert (pool[:, :, untouched] == SENTINEL).all() and (pool[0] == SENTINEL).all()  # padding and layer 0: nothing


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_matches_the_torch_reference(shape, dtype, device):
    skip_interpreted_bf16(dtype, device)
    q, k, v, cos, sin, pool, slots = inputs(*shape, dtype, device)
    want_pool = pool.clone()
    want_q = rotary_store_torch(q, k, v, cos, sin, want_pool[1, 0], want_pool[1, 1], slots)
    got_q = rotary_store_triton(q, k, v, cos, sin, pool[1, 0], pool[1, 1], slots)
    eps = 1e-5 if dtype is torch.float32 else 2 * torch.finfo(dtype).eps  # rotary's tolerance (test_fused)
    torch.testing.assert_close(got_q.float(), want_q.float(), rtol=eps, atol=eps * float(want_q.float().abs().max()))
    torch.testing.assert_close(
        pool.float(), want_pool.float(), rtol=eps, atol=eps * float(want_pool.float().abs().max())
    )
    torch.testing.assert_close(pool[1, 1], want_pool[1, 1], rtol=0, atol=0)  # v is copied, not computed


def test_k_and_v_are_cast_to_the_cache_dtype(device):
    q, k, v, cos, sin, pool, slots = inputs(5, 4, 2, 64, torch.float32, device, cache_dtype=torch.float16)
    want = pool.clone()
    rotary_store_torch(q, k, v, cos, sin, want[1, 0], want[1, 1], slots)
    rotary_store_triton(q, k, v, cos, sin, pool[1, 0], pool[1, 1], slots)
    assert pool.dtype == torch.float16
    torch.testing.assert_close(pool.float(), want.float(), rtol=1e-3, atol=1e-3)


def test_dispatch(device):
    """The public name runs Triton on CUDA tensors and the torch reference otherwise."""
    q, k, v, cos, sin, pool, slots = inputs(3, 4, 2, 64, torch.float32, device)
    want = pool.clone()
    impl = rotary_store_triton if device == "cuda" else rotary_store_torch
    assert torch.equal(
        rotary_store(q, k, v, cos, sin, pool[1, 0], pool[1, 1], slots),
        impl(q, k, v, cos, sin, want[1, 0], want[1, 1], slots),
    )
    assert torch.equal(pool, want)
