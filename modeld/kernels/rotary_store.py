"""Rotary embedding of a layer's new q and k, and the K/V write of the rotated k and v into the paged pool, in one
launch: what modeld.kernels.fused.rotary followed by the K/V write (kv_write.store_kv_torch) compute, bit for bit,
with one kernel fewer per layer (a decode graph's host launch time grows with its kernels) and no rotated-k tensor.

Slots follow kv_write: a slot < 0 (a padding row) writes nothing; q is rotated for every row.
"""

import torch
import triton
import triton.language as tl

from modeld.kernels.fused import _require_unit_last_stride, rotary_torch, rotated_halves
from modeld.kernels.kv_write import store_kv_torch


@triton.jit
def _rotary_store_kernel(
    q,
    k,
    v,
    cos,
    sin,
    q_out,
    k_cache,
    v_cache,
    slots,
    q_heads,
    kv_heads,
    half,
    q_tok,
    q_head,
    k_tok,
    k_head,
    v_tok,
    v_head,
    cos_tok,
    sin_tok,
    kc_tok,
    kc_head,
    kc_dim,
    vc_tok,
    vc_head,
    vc_dim,
    BLOCK_HALF: tl.constexpr,
):
    """Program (token, head), heads numbered q's, then k's, then v's. q and k heads are rotated as in
    fused._rotary_kernel (each product rounded to the input dtype, then their sum); q's go to q_out, k's to the
    k cache at the token's slot; v's are copied to the v cache at that slot."""
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    d = tl.arange(0, BLOCK_HALF)
    in_half = d < half
    slot = tl.load(slots + token).to(tl.int64)
    if (head >= q_heads) & (slot < 0):  # a padding row: its q is rotated, nothing is written
        return
    if head < q_heads + kv_heads:
        if head < q_heads:
            src = q + token * q_tok + head * q_head
        else:
            src = k + token * k_tok + (head - q_heads) * k_head
        out1, out2 = rotated_halves(src, cos + token * cos_tok, sin + token * sin_tok, d, half)
        if head < q_heads:  # (each branch names its own pointer: q_out and the caches may differ in dtype)
            q_dst = q_out + (token * q_heads + head) * (2 * half)
            tl.store(q_dst + d, out1, mask=in_half)
            tl.store(q_dst + half + d, out2, mask=in_half)
        else:
            k_dst = k_cache + slot * kc_tok + (head - q_heads) * kc_head
            tl.store(k_dst + d * kc_dim, out1, mask=in_half)
            tl.store(k_dst + (half + d) * kc_dim, out2, mask=in_half)
    else:
        v_src = v + token * v_tok + (head - q_heads - kv_heads) * v_head
        v_dst = v_cache + slot * vc_tok + (head - q_heads - kv_heads) * vc_head
        tl.store(v_dst + d * vc_dim, tl.load(v_src + d, mask=in_half), mask=in_half)
        tl.store(v_dst + (half + d) * vc_dim, tl.load(v_src + half + d, mask=in_half), mask=in_half)


def rotary_store_torch(q, k, v, cos, sin, k_cache, v_cache, slots):
    """Reference for `rotary_store`: rotary, then the K/V write of the rotated k and v."""
    q_out, k_out = rotary_torch(q, k, cos, sin)
    store_kv_torch(k_cache, v_cache, slots, k_out, v)
    return q_out


def rotary_store_triton(q, k, v, cos, sin, k_cache, v_cache, slots):
    """Triton version of `rotary_store`."""
    _require_unit_last_stride(q, k, v, cos, sin)
    tokens, q_heads, head_dim = q.shape
    kv_heads = k.shape[1]
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if tokens == 0:
        return q_out
    _rotary_store_kernel[(tokens, q_heads + 2 * kv_heads)](
        q,
        k,
        v,
        cos,
        sin,
        q_out,
        k_cache,
        v_cache,
        slots,
        q_heads,
        kv_heads,
        head_dim // 2,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        cos.stride(0),
        sin.stride(0),
        *k_cache.stride(),
        *v_cache.stride(),
        BLOCK_HALF=triton.next_power_of_2(head_dim // 2),
    )
    return q_out


def rotary_store(q, k, v, cos, sin, k_cache, v_cache, slots):
    """Rotates q and k (HF's apply_rotary_pos_emb) and writes the rotated k and v into row slots[i] of k_cache,
    v_cache (rows with slots[i] < 0 skipped; k/v cast to the cache dtype); returns the rotated q.

    q: [T, Hq, D], k, v: [T, Hk, D] of one dtype (any token and head strides, unit last stride); cos, sin: [T, D]
    in that dtype; caches [rows, Hk, D] (any strides); slots: int32/int64 [T], distinct where >= 0.
    """
    return (rotary_store_triton if q.is_cuda else rotary_store_torch)(q, k, v, cos, sin, k_cache, v_cache, slots)
