"""Writing new tokens' K/V rows into a paged KV pool: one layer, or several layers in one launch.

Caches are `k_cache, v_cache: [rows, kv_heads, head_dim]` (one layer, k/v `[N, kv_heads, head_dim]`) or
`[layers, rows, kv_heads, head_dim]` (k/v `[N, layers, kv_heads, head_dim]`: the DFLASH draft's context of every
layer), views of memd's `[layers, 2, rows, kv_heads, head_dim]` buffer: every kernel addresses them through their
strides. Slot 0 is the padding sink and is never written on purpose; a slot < 0 (target padding) or a translated
draft slot <= 0 ("no draft slot") means "skip this row".
The translated and prefix-valid writes come as a plain-torch reference (`*_torch`, also the CPU serving path), a
Triton launcher (`*_triton`) and a dispatcher that picks Triton for CUDA tensors; the plain write is torch only (on
CUDA the target writes its K/V in its rotary launch, modeld.kernels.rotary_store). k/v are cast to the cache dtype.
"""

import torch
import triton
import triton.language as tl

_MAX_TILE = 1024  # elements of one token's row copied by one program


@triton.jit
def _store_kv_kernel(
    k_cache,
    v_cache,
    slots,
    mapping,
    commit_lens,
    k,
    v,
    cols,
    head_dim,
    row_elems,
    kc_layer,
    kc_tok,
    kc_head,
    kc_dim,
    vc_layer,
    vc_tok,
    vc_head,
    vc_dim,
    k_layer,
    k_tok,
    k_head,
    k_dim,
    v_layer,
    v_tok,
    v_head,
    v_dim,
    TRANSLATE: tl.constexpr,
    PREFIX_ONLY: tl.constexpr,
    TILE: tl.constexpr,
):
    """Program (token, tile, layer): copy one tile of token's [kv_heads * head_dim] row of that layer into the
    layer's caches, or do nothing."""
    token = tl.program_id(0)
    if PREFIX_ONLY:  # token = b * cols + col; only columns < commit_lens[b] are written
        if token % cols >= tl.load(commit_lens + token // cols):
            return
    slot = tl.load(slots + token).to(tl.int64)
    if slot < 0:
        return
    if TRANSLATE:
        slot = tl.load(mapping + slot).to(tl.int64)
        if slot <= 0:
            return
    layer = tl.program_id(2).to(tl.int64)
    offs = tl.program_id(1) * TILE + tl.arange(0, TILE)
    in_row = offs < row_elems
    head = offs // head_dim
    dim = offs % head_dim
    k_row = tl.load(k + layer * k_layer + token * k_tok + head * k_head + dim * k_dim, mask=in_row)
    v_row = tl.load(v + layer * v_layer + token * v_tok + head * v_head + dim * v_dim, mask=in_row)
    tl.store(k_cache + layer * kc_layer + slot * kc_tok + head * kc_head + dim * kc_dim, k_row, mask=in_row)
    tl.store(v_cache + layer * vc_layer + slot * vc_tok + head * vc_head + dim * vc_dim, v_row, mask=in_row)


def _layered(k_cache, v_cache, k, v):
    """Caches [layers, rows, H, D] and k/v [N, layers, H, D]; one layer's ([rows, H, D], [N, H, D]) as a layer of
    one."""
    if k_cache.dim() == 3:
        return k_cache[None], v_cache[None], k[:, None], v[:, None]
    if k.dim() != 4 or k.shape[1] != k_cache.shape[0] or v.shape[1] != v_cache.shape[0]:
        raise ValueError(
            f"caches of {k_cache.shape[0]} layers take k/v [N, layers, kv_heads, head_dim], not {tuple(k.shape)}"
        )
    return k_cache, v_cache, k, v


def _launch_store(k_cache, v_cache, slots, k, v, mapping=None, commit_lens=None, cols=1):
    """Launch `_store_kv_kernel` over tokens of `slots` (flat [N]) and k/v, every layer in one launch."""
    k_cache, v_cache, k, v = _layered(k_cache, v_cache, k, v)
    n, layers, kv_heads, head_dim = k.shape
    if n == 0:
        return
    row_elems = kv_heads * head_dim
    tile = min(triton.next_power_of_2(row_elems), _MAX_TILE)
    grid = (n, triton.cdiv(row_elems, tile), layers)
    _store_kv_kernel[grid](
        k_cache,
        v_cache,
        slots,
        slots if mapping is None else mapping,  # unused placeholder pointers when the flag is off
        slots if commit_lens is None else commit_lens,
        k,
        v,
        cols,
        head_dim,
        row_elems,
        *k_cache.stride(),
        *v_cache.stride(),
        *(k.stride(i) for i in (1, 0, 2, 3)),
        *(v.stride(i) for i in (1, 0, 2, 3)),  # k/v [N, layers, ...]
        TRANSLATE=mapping is not None,
        PREFIX_ONLY=commit_lens is not None,
        TILE=tile,
    )


# --- 1. store_kv_torch: k_cache[slots[i]] = k[i] (the references' write; the target's own is kernels.rotary_store) ---


def store_kv_torch(k_cache, v_cache, slots, k, v):
    """Write k[i], v[i] into row slots[i] of k_cache, v_cache (cast to the cache dtype); rows with slots[i] < 0 are
    skipped. k_cache, v_cache: [rows, kv_heads, head_dim]; slots: int [N], distinct where >= 0; k, v: [N, kv_heads,
    head_dim] (or caches [layers, rows, ...] and k, v [N, layers, ...]: every layer's row). In place; the CPU's
    write and the torch references' (on CUDA the target writes K/V in its rotary launch,
    modeld.kernels.rotary_store)."""
    k_cache, v_cache, k, v = _layered(k_cache, v_cache, k, v)
    keep = slots >= 0
    rows = slots[keep].long()
    k_cache[:, rows] = k[keep].transpose(0, 1).to(k_cache.dtype)
    v_cache[:, rows] = v[keep].transpose(0, 1).to(v_cache.dtype)


# --- 2. store_kv_translated: into the draft cache, at mapping[target slot] ----------------------------------------


def store_kv_translated_torch(k_cache, v_cache, target_slots, mapping, k, v):
    """Reference for `store_kv_translated`."""
    draft_slots = torch.where(target_slots >= 0, mapping[target_slots.long().clamp(min=0)], 0)
    store_kv_torch(k_cache, v_cache, torch.where(draft_slots > 0, draft_slots, -1), k, v)


def store_kv_translated_triton(k_cache, v_cache, target_slots, mapping, k, v):
    """Triton version of `store_kv_translated`."""
    _launch_store(k_cache, v_cache, target_slots, k, v, mapping=mapping)


def store_kv_translated(k_cache, v_cache, target_slots, mapping, k, v):
    """Write k[i], v[i] into the DRAFT cache at row mapping[target_slots[i]].

    k_cache, v_cache: draft caches [draft_rows, kv_heads, head_dim]; target_slots: int32/int64 [N];
    mapping: int32 [target_rows], target slot -> draft slot, 0 = no draft slot; k, v: [N, kv_heads, head_dim].
    Or every layer at once: caches [layers, draft_rows, kv_heads, head_dim], k, v [N, layers, kv_heads, head_dim].
    Skipped: target_slots[i] < 0, and translated slots <= 0 (out of the draft window). In place; returns None.
    """
    fn = store_kv_translated_triton if k_cache.is_cuda else store_kv_translated_torch
    fn(k_cache, v_cache, target_slots, mapping, k, v)


# --- 3. store_kv_prefix_valid: a fixed [B, L] block of which only each row's first commit_lens[b] are written -----


def _flatten_block(k_cache, slots_2d, k, v):
    """slots [B, L] -> [B*L]; k, v [B, L, *row] or [B*L, *row] -> [B*L, *row] (views where possible), a token's row
    being [H, D] (one layer's caches) or [layers, H, D]."""
    n, row = slots_2d.numel(), k_cache.dim() - 1
    return slots_2d.reshape(n), k.reshape(n, *k.shape[-row:]), v.reshape(n, *v.shape[-row:])


def store_kv_prefix_valid_torch(k_cache, v_cache, slots_2d, commit_lens, k, v, mapping=None):
    """Reference for `store_kv_prefix_valid`."""
    cols = torch.arange(slots_2d.shape[1], device=slots_2d.device)
    committed = cols[None, :] < commit_lens[:, None].long()
    slots, k, v = _flatten_block(k_cache, torch.where(committed, slots_2d, -1), k, v)
    if mapping is None:
        store_kv_torch(k_cache, v_cache, slots, k, v)
    else:
        store_kv_translated_torch(k_cache, v_cache, slots, mapping, k, v)


def store_kv_prefix_valid_triton(k_cache, v_cache, slots_2d, commit_lens, k, v, mapping=None):
    """Triton version of `store_kv_prefix_valid`."""
    cols = slots_2d.shape[1]
    slots, k, v = _flatten_block(k_cache, slots_2d, k, v)
    _launch_store(k_cache, v_cache, slots, k, v, mapping=mapping, commit_lens=commit_lens, cols=cols)


def store_kv_prefix_valid(k_cache, v_cache, slots_2d, commit_lens, k, v, mapping=None):
    """Write the committed prefix of a fixed-shape block of B x L tokens (e.g. accepted draft tokens).

    slots_2d: int32/int64 [B, L] target slots; commit_lens: int [B]; k, v: [B, L, kv_heads, head_dim] or
    [B*L, kv_heads, head_dim] (or, with caches of several layers, [B, L, layers, kv_heads, head_dim] or
    [B*L, layers, kv_heads, head_dim]: one launch for all). Token (b, col) is written iff col < commit_lens[b] and
    slots_2d[b, col] >= 0, at row
    slots_2d[b, col], or with `mapping` (int32 [target_rows]) at draft row mapping[slots_2d[b, col]], skipped if
    that is <= 0. In place; returns None.
    """
    fn = store_kv_prefix_valid_triton if k_cache.is_cuda else store_kv_prefix_valid_torch
    fn(k_cache, v_cache, slots_2d, commit_lens, k, v, mapping)
