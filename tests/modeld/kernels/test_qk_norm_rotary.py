"""The per-head q/k RMSNorm + rotary in one launch against its torch reference (rms_norm of each, then rotary):
strided q and k views of one q|k|v projection, odd token counts, each dtype (bf16 not through Triton's interpreter,
as tests/modeld/kernels/test_fused.py says why); on the CPU through the interpreter, on CUDA compiled."""

import pytest
import torch

from modeld.kernels.fused import rms_norm_torch, rotary_torch
from modeld.kernels.qk_norm_rotary import qk_norm_rotary, qk_norm_rotary_torch, qk_norm_rotary_triton
from tests.modeld.kernels.test_fused import DTYPES, assert_matches, skip_interpreted_bf16


def _case(device, dtype, tokens, q_heads=4, k_heads=2, head_dim=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(tokens, (q_heads + 2 * k_heads) * head_dim, generator=g).to(device, dtype)
    q, k, _ = qkv.split((q_heads * head_dim, k_heads * head_dim, k_heads * head_dim), dim=-1)
    angles = torch.rand(tokens, head_dim // 2, generator=g) * 6.28
    cos, sin = (torch.cat([f(angles)] * 2, dim=-1).to(device, dtype) for f in (torch.cos, torch.sin))
    weights = [(1 + 0.1 * torch.randn(head_dim, generator=g)).to(device, dtype) for _ in range(2)]
    return q.unflatten(-1, (q_heads, head_dim)), k.unflatten(-1, (k_heads, head_dim)), *weights, cos, sin


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", [1, 7, 16])
def test_equals_the_norms_then_rotary(device, dtype, tokens):
    skip_interpreted_bf16(dtype, device)
    q, k, qw, kw, cos, sin = _case(device, dtype, tokens)
    got_q, got_k = qk_norm_rotary_triton(q, k, qw, kw, 1e-6, cos, sin)
    want_q, want_k = qk_norm_rotary_torch(q, k, qw, kw, 1e-6, cos, sin)
    assert got_q.is_contiguous() and got_k.is_contiguous()
    assert_matches(got_q, want_q)  # the head's sum of squares is taken by halves: at most an ulp's move, rarely
    assert_matches(got_k, want_k)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_keys_alone_in_groups_of_heads_each_with_its_weight(device, dtype):
    """The draft's context keys: no q heads, k's 6 heads in 3 groups (layers), a norm weight each; against the
    keys normed with a unit weight, times their group's weight, then rotated (what the serving draft ran before)."""
    _, k, _, _, cos, sin = _case(device, dtype, 5, k_heads=6)
    weights = (1 + 0.1 * torch.randn(3, k.shape[-1], generator=torch.Generator().manual_seed(9))).to(device, dtype)
    unit = torch.ones(k.shape[-1], device=device, dtype=dtype)
    by_group = (
        rms_norm_torch(k.reshape(-1, k.shape[-1]), unit, 1e-6)[0].view(5, 3, 2, -1) * weights[None, :, None, :]
    ).view(5, 6, -1)
    want = rotary_torch(by_group[:, :0], by_group, cos, sin)[1]
    assert torch.equal(qk_norm_rotary_torch(k[:, :0], k, weights[0], weights, 1e-6, cos, sin)[1], want)
    assert_matches(qk_norm_rotary_triton(k[:, :0], k, weights[0], weights, 1e-6, cos, sin)[1], want)


def test_the_dispatcher_takes_torch_on_the_cpu():
    q, k, qw, kw, cos, sin = _case("cpu", torch.float32, 3)
    want_q, want_k = qk_norm_rotary_torch(q, k, qw, kw, 1e-6, cos, sin)
    for got, want in zip(qk_norm_rotary(q, k, qw, kw, 1e-6, cos, sin), (want_q, want_k)):
        assert torch.equal(got, want)
