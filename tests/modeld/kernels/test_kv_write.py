"""KV write kernels vs an explicit per-token loop: exactly the expected rows change, bit for bit, and nothing else.

Caches are layer-1 views of a sentinel-filled [layers, 2, rows, kv_heads, head_dim] pool (so other layers, the sink
page and skipped rows must keep the sentinel), and k/v are strided slices of a wider tensor.
"""

import pytest
import torch

from modeld.kernels.kv_write import (
    store_kv_prefix_valid,
    store_kv_prefix_valid_torch,
    store_kv_prefix_valid_triton,
    store_kv_torch,
    store_kv_translated,
    store_kv_translated_torch,
    store_kv_translated_triton,
)

SENTINEL = -7.0
LAYER = 1


def make_pool(pages, page_size, kv_heads, head_dim, dtype, device):
    """Sentinel-filled pool [2 layers, 2, pages * page_size, kv_heads, head_dim]; returns it and layer 1's k/v views."""
    pool = torch.full((2, 2, pages * page_size, kv_heads, head_dim), SENTINEL, dtype=dtype, device=device)
    return pool, pool[LAYER, 0], pool[LAYER, 1]


def make_kv(n, kv_heads, head_dim, dtype, device):
    """Random k, v [n, kv_heads, head_dim] that are non-contiguous slices of one [n, 3, ...] tensor (like qkv)."""
    qkv = torch.randn(n, 3, kv_heads, head_dim).to(dtype).to(device)
    return qkv[:, 1], qkv[:, 2]


def pages_for(n, page_size):
    """Enough pages for n tokens besides the sink page, with room to spare."""
    return 2 + 2 * n // page_size


def random_slots(n, pages, page_size):
    """n distinct slots outside the sink page (page 0), on random pages."""
    return page_size + torch.randperm((pages - 1) * page_size)[:n]


def expected_pool(pool, slots, k, v):
    """The pool after writing k[i], v[i] at slots[i] of layer LAYER for every slot > 0 (None / <= 0 = skip)."""
    return expected_layered(pool, slots, k[:, None], v[:, None])


def expected_layered(pool, slots, k, v):
    """The pool after writing every layer's k[i, layer], v[i, layer] at slots[i] of layer LAYER + layer (None / <= 0 =
    skip), one token and layer at a time."""
    pool = pool.clone()
    for i, slot in enumerate(slots):
        for layer in range(k.shape[1]):
            if slot is not None and slot > 0:
                pool[LAYER + layer, 0, slot] = k[i, layer]
                pool[LAYER + layer, 1, slot] = v[i, layer]
    return pool


SHAPES = [  # (tokens, kv_heads, head_dim, page_size); 3 * 352 > 1024 elements needs two tiles per row
    (1, 3, 16, 1),
    (7, 3, 80, 64),
    (33, 3, 16, 64),
    (7, 1, 352 * 3, 1),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("n,kv_heads,head_dim,page_size", SHAPES)
@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64], ids=["i32", "i64"])
def test_store_kv_torch(dtype, n, kv_heads, head_dim, page_size, slot_dtype, device):
    """The references' plain write (the target's own is rotary_store's, tested against it)."""
    torch.manual_seed(n + head_dim)
    pages = pages_for(n, page_size)
    pool, k_cache, v_cache = make_pool(pages, page_size, kv_heads, head_dim, dtype, device)
    slots = random_slots(n, pages, page_size)
    slots[1::3] = -1  # padding tokens
    k, v = make_kv(n, kv_heads, head_dim, dtype, device)
    expected = expected_pool(pool, slots.tolist(), k, v)

    store_kv_torch(k_cache, v_cache, slots.to(slot_dtype).to(device), k, v)

    assert torch.equal(pool, expected)


def make_mapping(target_rows, mapped_targets, draft_slots):
    """int32 target -> draft map, 0 everywhere except mapped_targets[i] -> draft_slots[i]."""
    mapping = torch.zeros(target_rows, dtype=torch.int32)
    mapping[mapped_targets] = draft_slots.to(torch.int32)
    return mapping


@pytest.mark.parametrize(
    "impl",
    [store_kv_translated_torch, store_kv_translated_triton, store_kv_translated],
    ids=["torch", "triton", "public"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("n,kv_heads,head_dim,page_size", SHAPES[:3])
def test_store_kv_translated(impl, dtype, n, kv_heads, head_dim, page_size, device):
    torch.manual_seed(n)
    target_pages, draft_pages = pages_for(n, page_size), pages_for(n // 2, page_size)
    pool, k_cache, v_cache = make_pool(draft_pages, page_size, kv_heads, head_dim, dtype, device)
    target_slots = random_slots(n, target_pages, page_size)
    in_window = torch.arange(n) % 3 != 0  # the rest are unmapped (mapping 0: outside the draft window)
    mapping = make_mapping(
        target_pages * page_size, target_slots[in_window], random_slots(int(in_window.sum()), draft_pages, page_size)
    )
    target_slots[2::5] = -1  # padding tokens
    k, v = make_kv(n, kv_heads, head_dim, dtype, device)
    expected = expected_pool(pool, [int(mapping[t]) if t >= 0 else None for t in target_slots.tolist()], k, v)

    impl(k_cache, v_cache, target_slots.to(device), mapping.to(device), k, v)

    assert torch.equal(pool, expected)


@pytest.mark.parametrize(
    "impl",
    [store_kv_prefix_valid_torch, store_kv_prefix_valid_triton, store_kv_prefix_valid],
    ids=["torch", "triton", "public"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("translated", [False, True], ids=["direct", "translated"])
@pytest.mark.parametrize("flat_kv", [False, True], ids=["kv_BL", "kv_flat"])
@pytest.mark.parametrize("batch,cols,page_size", [(1, 1, 1), (3, 5, 64)])
def test_store_kv_prefix_valid(impl, dtype, translated, flat_kv, batch, cols, page_size, device):
    torch.manual_seed(batch * cols)
    kv_heads, head_dim, n = 3, 16, batch * cols
    target_pages, draft_pages = pages_for(n, page_size), pages_for(n // 2, page_size)
    pool, k_cache, v_cache = make_pool(
        draft_pages if translated else target_pages, page_size, kv_heads, head_dim, dtype, device
    )
    slots = random_slots(n, target_pages, page_size)
    commit_lens = torch.tensor([cols, 0, 2][:batch], dtype=torch.int32)  # all, none, some
    mapping = None
    if translated:
        mapped = torch.arange(n) != 1  # one committed token is outside the draft window
        mapping = make_mapping(
            target_pages * page_size, slots[mapped], random_slots(int(mapped.sum()), draft_pages, page_size)
        )
    slots[n - 1] = -1  # a padding token (committed only if it lies in row 0)
    k, v = make_kv(n, kv_heads, head_dim, dtype, device)
    committed = [col < commit_lens[b] for b in range(batch) for col in range(cols)]
    written = [s if ok and s >= 0 else None for s, ok in zip(slots.tolist(), committed)]
    if translated:
        written = [None if s is None else int(mapping[s]) for s in written]
    expected = expected_pool(pool, written, k, v)
    if not flat_kv:
        k, v = k.unflatten(0, (batch, cols)), v.unflatten(0, (batch, cols))

    impl(
        k_cache,
        v_cache,
        slots.reshape(batch, cols).to(device),
        commit_lens.to(device),
        k,
        v,
        None if mapping is None else mapping.to(device),
    )

    assert torch.equal(pool, expected)


# --- caches of several layers in one write (the DFLASH draft's context of every layer) -------------------------------


def make_layered(n, layers, pages, page_size, kv_heads, head_dim, dtype, device):
    """A sentinel pool of LAYER + `layers` layers whose last `layers` are written (layer 0 must keep the sentinel), its
    k/v caches [layers, rows, H, D], and k, v [n, layers, H, D] as views of one projection [n, 2, layers, H, D] (as
    ServingDraft.context_kv_layers returns them)."""
    pool = torch.full((LAYER + layers, 2, pages * page_size, kv_heads, head_dim), SENTINEL, dtype=dtype, device=device)
    kv = torch.randn(n, 2, layers, kv_heads, head_dim).to(dtype).to(device)
    return pool, pool[LAYER:, 0], pool[LAYER:, 1], kv[:, 0], kv[:, 1]


@pytest.mark.parametrize(
    "impl",
    [store_kv_translated_torch, store_kv_translated_triton, store_kv_translated],
    ids=["torch", "triton", "public"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_store_kv_translated_every_layer(impl, dtype, device):
    torch.manual_seed(5)
    n, layers, kv_heads, head_dim, page_size = 9, 3, 3, 16, 4
    target_pages, draft_pages = pages_for(n, page_size), pages_for(n, page_size)
    pool, k_cache, v_cache, k, v = make_layered(n, layers, draft_pages, page_size, kv_heads, head_dim, dtype, device)
    target_slots = random_slots(n, target_pages, page_size)
    in_window = torch.arange(n) % 4 != 0
    mapping = make_mapping(
        target_pages * page_size, target_slots[in_window], random_slots(int(in_window.sum()), draft_pages, page_size)
    )
    target_slots[5] = -1  # a padding token
    expected = expected_layered(pool, [int(mapping[t]) if t >= 0 else None for t in target_slots.tolist()], k, v)

    impl(k_cache, v_cache, target_slots.to(device), mapping.to(device), k, v)

    assert torch.equal(pool, expected)


@pytest.mark.parametrize(
    "impl",
    [store_kv_prefix_valid_torch, store_kv_prefix_valid_triton, store_kv_prefix_valid],
    ids=["torch", "triton", "public"],
)
@pytest.mark.parametrize("flat_kv", [False, True], ids=["kv_BL", "kv_flat"])
def test_store_kv_prefix_valid_every_layer(impl, flat_kv, device):
    torch.manual_seed(6)
    batch, cols, layers, kv_heads, head_dim, page_size = 3, 4, 2, 3, 16, 4
    n = batch * cols
    target_pages, draft_pages = pages_for(n, page_size), pages_for(n, page_size)
    pool, k_cache, v_cache, k, v = make_layered(
        n, layers, draft_pages, page_size, kv_heads, head_dim, torch.bfloat16, device
    )
    slots = random_slots(n, target_pages, page_size)
    mapping = make_mapping(target_pages * page_size, slots, random_slots(n, draft_pages, page_size))
    commit_lens = torch.tensor([cols, 0, 3], dtype=torch.int32)
    committed = [col < commit_lens[b] for b in range(batch) for col in range(cols)]
    expected = expected_layered(
        pool, [int(mapping[s]) if ok else None for s, ok in zip(slots.tolist(), committed)], k, v
    )
    if not flat_kv:
        k, v = k.unflatten(0, (batch, cols)), v.unflatten(0, (batch, cols))

    impl(k_cache, v_cache, slots.reshape(batch, cols).to(device), commit_lens.to(device), k, v, mapping.to(device))

    assert torch.equal(pool, expected)


def test_caches_of_several_layers_need_kv_of_as_many():
    pool = torch.zeros(3, 2, 8, 1, 4)
    k = torch.zeros(2, 2, 1, 4)  # two layers, for caches of three
    with pytest.raises(ValueError, match="caches of 3 layers"):
        store_kv_translated_torch(
            pool[:, 0], pool[:, 1], torch.tensor([1, 2]), torch.arange(8, dtype=torch.int32), k, k
        )
