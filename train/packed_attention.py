"""Attention over packed rows under a mask function: flex attention under a BlockMask on CUDA (compiled, inside a
compiled function or alone), the same mask evaluated densely on the CPU (where flex attention has no backward).
q is [N, heads, D], k and v [M, kv_heads, D] (fewer heads: grouped-query attention); the result is [N, heads, D]."""

import functools

import torch
from torch.nn.attention.flex_attention import flex_attention


def flex(q, k, v, block_mask, scale: float) -> torch.Tensor:
    """q [N, heads, D] over k, v [M, kv_heads, D] under a BlockMask -> [N, heads, D]; uncompiled it materialises
    every score, so it runs inside a compiled function (compiled_blocks) or compiled itself (flex_dynamic)."""
    q, k, v = (x.transpose(0, 1)[None] for x in (q, k, v))
    out = flex_attention(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    return out[0].transpose(0, 1)


@functools.cache
def compiled_flex_dynamic():
    return torch.compile(flex, dynamic=True)


def flex_dynamic(q, k, v, block_mask, scale: float) -> torch.Tensor:
    """flex for shapes that change every call (an evaluation's sequences), compiled alone."""
    return compiled_flex_dynamic()(q, k, v, block_mask, scale)


DENSE_QUERY_ROWS = 2048  # query rows a time on the dense path (its mask and scores are [rows x keys])


def dense(q, k, v, visible, scale: float) -> torch.Tensor:
    """flex's result with the mask function `visible` evaluated densely, a slice of query rows at a time, through
    scaled-dot-product attention: the CPU's path, where flex attention has no backward."""
    groups = q.shape[1] // k.shape[1]
    k, v = (x.repeat_interleave(groups, dim=1).transpose(0, 1) for x in (k, v))
    keys = torch.arange(k.shape[1], device=q.device)[None, :]
    out = []
    for begin in range(0, len(q), DENSE_QUERY_ROWS):
        rows = torch.arange(begin, min(begin + DENSE_QUERY_ROWS, len(q)), device=q.device)[:, None]
        part = q[begin : begin + DENSE_QUERY_ROWS].transpose(0, 1)
        out.append(
            torch.nn.functional.scaled_dot_product_attention(
                part, k, v, attn_mask=visible(0, 0, rows, keys), scale=scale
            ).transpose(0, 1)
        )
    return torch.cat(out)
