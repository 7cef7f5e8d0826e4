"""The torch path's masked attention (modeld.kernels.draft_attention.masked_attention, the draft module's): the
softmax of the visible scores, whatever backend runs it, and on the GPU never cuDNN (a plan per new shape costs
milliseconds of host time)."""

import pytest
import torch

from modeld.kernels.draft_attention import masked_attention


def reference(q, k, v, visible, scale):
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale
    scores = scores.masked_fill(~visible, float("-inf"))
    return (scores.softmax(dim=-1) @ v.float()).to(q.dtype)


def draft_shapes(n: int, device: str, dtype: torch.dtype, context: int = 255, block: int = 16, heads: int = 9):
    """q [n, heads, block, 64] over `context` context positions then the block, as a verify step's propose
    sees them: each row sees a different prefix of the context (one row sees none of it), and the whole block."""
    gen = torch.Generator().manual_seed(n)
    q, k, v = (
        torch.randn(n, heads, length, 64, generator=gen).to(device, dtype)
        for length in (block, context + block, context + block)
    )
    seen = torch.randint(0, context + 1, (n,), generator=gen)
    seen[0] = 0
    ctx_visible = torch.arange(context)[None, :] < seen[:, None]  # [n, context]
    visible = torch.cat(
        [ctx_visible[:, None, :].expand(n, block, context), torch.ones(n, block, block, dtype=torch.bool)], -1
    )
    return q, k, v, visible[:, None].to(device)


@pytest.mark.parametrize("n", [1, 3])
def test_masked_attention_is_the_softmax_over_visible_positions(n):
    q, k, v, visible = draft_shapes(n, "cpu", torch.float32)
    got = masked_attention(q, k, v, visible, 0.125)
    torch.testing.assert_close(got, reference(q, k, v, visible, 0.125), atol=1e-5, rtol=1e-5)


def test_a_hidden_position_has_no_influence():
    q, k, v, visible = draft_shapes(2, "cpu", torch.float32)
    hidden = (~visible[0, 0, 0]).nonzero()[0, 0]  # a context position row 0 does not see
    v2 = v.clone()
    v2[0, :, hidden] += 100.0
    torch.testing.assert_close(
        masked_attention(q, k, v2, visible, 0.125)[0], masked_attention(q, k, v, visible, 0.125)[0]
    )


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 5, 16])
def test_gpu_draft_attention_runs_the_memory_efficient_kernel_not_cudnn(n):
    q, k, v, visible = draft_shapes(n, "cuda", torch.bfloat16)
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    ) as prof:
        got = masked_attention(q, k, v, visible, 0.125)
        torch.cuda.synchronize()
    names = [e.name.lower() for e in prof.events()]
    assert not [name for name in names if "cudnn" in name], "the draft's attention ran on cuDNN"
    assert [name for name in names if "efficient_attention" in name or "fmha" in name], sorted(set(names))
    torch.testing.assert_close(got, reference(q, k, v, visible, 0.125), atol=2e-2, rtol=2e-2)
