"""Causal (optionally sliding-window) attention of packed queries over a paged KV pool (one layer).

Serves decode (every q_len 1) and extend/verify (q_len > 1, with or without a cached prefix) alike. Key position p of
request b lives at slot req_to_token[rows[b], p] of k_cache/v_cache, or, with `mapping` (the DFLASH draft reading
its sliding window from its own pool), at draft slot mapping[req_to_token[rows[b], p]]. The caller has already
written the K/V of every key position 0 .. kv_lens[b]-1.
"""

import torch
import triton
import triton.language as tl


def paged_attention_torch(
    q,
    k_cache,
    v_cache,
    req_to_token,
    rows,
    q_starts,
    q_lens,
    kv_lens,
    sm_scale,
    window=None,
    mapping=None,
    out=None,
    qo_indptr=None,
):
    """Reference for `paged_attention`: per request, gather the keys the queries may see and softmax in fp32."""
    out = torch.empty_like(q) if out is None else out
    group = q.shape[1] // k_cache.shape[1]
    qo = 0
    for row, q_start, q_len, kv_len in zip(rows.tolist(), q_starts.tolist(), q_lens.tolist(), kv_lens.tolist()):
        first_key = 0 if window is None else max(0, q_start - window + 1)  # the first query's window start
        key_pos = torch.arange(first_key, kv_len, device=q.device)
        query_pos = torch.arange(q_start, q_start + q_len, device=q.device)
        slots = req_to_token[row, first_key:kv_len].long()
        if mapping is not None:
            slots = mapping[slots].long()
        k = k_cache[slots].float().repeat_interleave(group, dim=1)  # [keys, q_heads, head_dim]
        v = v_cache[slots].float().repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q[qo : qo + q_len].float(), k) * sm_scale
        visible = key_pos[None, :] <= query_pos[:, None]
        if window is not None:
            visible &= key_pos[None, :] > query_pos[:, None] - window
        probs = scores.masked_fill(~visible, float("-inf")).softmax(dim=-1)
        out[qo : qo + q_len] = torch.einsum("hqk,khd->qhd", probs, v).to(out.dtype)
        qo += q_len
    return out


DECODE_GATHER_LIMIT = 1 << 24  # elements of the gathered keys a batched CPU decode may hold (64 MiB in fp32)


def decode_attention_torch(
    q, k_cache, v_cache, req_to_token, rows, q_starts, kv_lens, sm_scale, window=None, mapping=None, out=None
):
    """`paged_attention_torch` for a step whose every request has one query, batched over the requests: keys
    0 .. max(kv_lens)-1 of every request gathered at once, the ones a query may not see masked out of the scores
    and zeroed in the values (so rows never written, NaN, read nothing)."""
    out = torch.empty_like(q) if out is None else out
    batch, q_heads, head_dim = q.shape
    kv_heads = k_cache.shape[1]
    span = int(kv_lens.max())
    key_pos = torch.arange(span, device=q.device)[None, :]
    query_pos = q_starts.long()[:, None]
    visible = (key_pos <= query_pos) & (key_pos < kv_lens.long()[:, None])
    if window is not None:
        visible &= key_pos > query_pos - window
    slots = req_to_token[rows.long(), :span].long()
    if mapping is not None:
        slots = mapping[slots].long()
    k = k_cache[slots].float()  # [batch, span, kv_heads, head_dim]
    v = v_cache[slots].float().masked_fill(~visible[:, :, None, None], 0.0)
    grouped = q.float().view(batch, kv_heads, q_heads // kv_heads, head_dim)  # head h reads kv head h // group
    scores = torch.einsum("bhgd,bkhd->bhgk", grouped, k) * sm_scale
    probs = scores.masked_fill(~visible[:, None, None, :], float("-inf")).softmax(dim=-1)
    out.copy_(torch.einsum("bhgk,bkhd->bhgd", probs, v).reshape(batch, q_heads, head_dim))
    return out


@triton.jit
def _paged_attention_kernel(
    q,
    k_cache,
    v_cache,
    out,
    req_to_token,
    mapping,
    rows,
    q_starts,
    q_lens,
    kv_lens,
    qo_indptr,
    sm_scale,
    window,
    head_dim,
    q_tok,
    q_head,
    q_dim,
    o_tok,
    o_head,
    o_dim,
    k_tok,
    k_head,
    k_dim,
    v_tok,
    v_head,
    v_dim,
    r2t_row,
    GROUP: tl.constexpr,
    QUERIES_PER_BLOCK: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    TRANSLATE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Program (request b, query block, kv head): the tile's BLOCK_M rows are (query i, head g of the kv head's
    group) pairs, row = i * GROUP + g, so K/V are loaded once per group. Online softmax over key blocks that cover
    only [first key any row may see, last query position]."""
    b = tl.program_id(0)
    kv_head = tl.program_id(2)
    first_query = tl.program_id(1) * QUERIES_PER_BLOCK
    q_len = tl.load(q_lens + b)
    if first_query >= q_len:
        return
    q_start = tl.load(q_starts + b)
    kv_len = tl.load(kv_lens + b)
    req_row = tl.load(rows + b).to(tl.int64)
    qo = tl.load(qo_indptr + b).to(tl.int64)

    tile_row = tl.arange(0, BLOCK_M)
    query = first_query + tile_row // GROUP
    head = kv_head * GROUP + tile_row % GROUP
    row_ok = (tile_row < QUERIES_PER_BLOCK * GROUP) & (query < q_len)
    query_pos = q_start + query
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < head_dim

    q_ptrs = q + (qo + query)[:, None] * q_tok + head[:, None] * q_head + dims[None, :] * q_dim
    q_tile = tl.load(q_ptrs, mask=row_ok[:, None] & dim_ok[None, :], other=0.0)

    last_key = tl.minimum(q_start + tl.minimum(first_query + QUERIES_PER_BLOCK, q_len) - 1, kv_len - 1)
    first_key = 0
    if HAS_WINDOW:
        first_key = tl.maximum(q_start + first_query - window + 1, 0)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for block_start in range(first_key, last_key + 1, BLOCK_N):
        key_pos = block_start + tl.arange(0, BLOCK_N)
        key_ok = key_pos <= last_key
        slot = tl.load(req_to_token + req_row * r2t_row + key_pos, mask=key_ok, other=0).to(tl.int64)
        if TRANSLATE:
            slot = tl.load(mapping + slot, mask=key_ok, other=0).to(tl.int64)
        k_ptrs = k_cache + slot[None, :] * k_tok + kv_head * k_head + dims[:, None] * k_dim
        k_tile = tl.load(k_ptrs, mask=key_ok[None, :] & dim_ok[:, None], other=0.0)  # [BLOCK_D, BLOCK_N]
        scores = tl.dot(q_tile, k_tile, input_precision=DOT_PRECISION) * sm_scale

        visible = key_ok[None, :] & (key_pos[None, :] <= query_pos[:, None])
        if HAS_WINDOW:
            visible = visible & (key_pos[None, :] > query_pos[:, None] - window)
        scores = tl.where(visible, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that saw no key yet: keep exp() finite
        p = tl.exp(scores - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)

        v_ptrs = v_cache + slot[:, None] * v_tok + kv_head * v_head + dims[None, :] * v_dim
        v_tile = tl.load(v_ptrs, mask=key_ok[:, None] & dim_ok[None, :], other=0.0)  # [BLOCK_N, BLOCK_D]
        acc = acc * alpha[:, None] + tl.dot(p.to(v_tile.dtype), v_tile, input_precision=DOT_PRECISION)
        m_i = m_new

    l_i = tl.where(row_ok, l_i, 1.0)  # padding rows of the tile saw no key; they are not stored
    o_ptrs = out + (qo + query)[:, None] * o_tok + head[:, None] * o_head + dims[None, :] * o_dim
    tl.store(o_ptrs, acc / l_i[:, None], mask=row_ok[:, None] & dim_ok[None, :])


def paged_attention_triton(
    q,
    k_cache,
    v_cache,
    req_to_token,
    rows,
    q_starts,
    q_lens,
    kv_lens,
    sm_scale,
    window=None,
    mapping=None,
    out=None,
    qo_indptr=None,
    block_m=64,
    block_n=64,
):
    """Triton version of `paged_attention`; block_m (tile rows = queries x group heads) and block_n (keys per
    step) are powers of two >= 16."""
    out = torch.empty_like(q) if out is None else out
    total_q, q_heads, head_dim = q.shape
    kv_heads = k_cache.shape[1]
    group = q_heads // kv_heads
    block_m = max(block_m, triton.next_power_of_2(group))
    if qo_indptr is None:
        qo_indptr = torch.cumsum(q_lens, 0) - q_lens
    # Query blocks per request: bounded by total_q (>= max q_len) so no device->host sync is needed; blocks past a
    # request's own q_len exit at once.
    queries_per_block = block_m // group
    grid = (rows.shape[0], triton.cdiv(total_q, queries_per_block), kv_heads)
    _paged_attention_kernel[grid](
        q,
        k_cache,
        v_cache,
        out,
        req_to_token,
        req_to_token if mapping is None else mapping,
        rows,
        q_starts,
        q_lens,
        kv_lens,
        qo_indptr,
        sm_scale,
        0 if window is None else window,
        head_dim,
        *q.stride(),
        *out.stride(),
        *k_cache.stride(),
        *v_cache.stride(),
        req_to_token.stride(0),
        GROUP=group,
        QUERIES_PER_BLOCK=queries_per_block,
        HAS_WINDOW=window is not None,
        TRANSLATE=mapping is not None,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else None,  # no tf32 for fp32
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
    )
    return out


def paged_attention(
    q,
    k_cache,
    v_cache,
    req_to_token,
    rows,
    q_starts,
    q_lens,
    kv_lens,
    sm_scale,
    window=None,
    mapping=None,
    out=None,
    qo_indptr=None,
):
    """Causal GQA attention of B requests' packed queries over their keys in a paged KV pool.

    q: [total_q, q_heads, head_dim], request b's q_lens[b] queries back to back (in request order);
    k_cache, v_cache: [rows, kv_heads, head_dim] (any strides), q_heads a multiple of kv_heads (head h reads kv
    head h // (q_heads // kv_heads)); req_to_token: int32 [max_requests + 1, context_len] (position -> slot);
    rows, q_starts, q_lens, kv_lens: int [B]. The query at position t = q_starts[b] + i sees key positions p with
    p <= t, p < kv_lens[b], and with `window` W (>= 1, HF semantics: the last W positions including itself) also
    p > t - W. Needs q_starts[b] + q_lens[b] <= kv_lens[b] (every query sees its own key). With `mapping`
    (int32 [target_rows], target slot -> draft slot) the caches are the draft's and position p's row is
    mapping[req_to_token[rows[b], p]]. Only positions from max(0, q_starts[b] - W + 1) to kv_lens[b] - 1 are
    ever read, so rows outside may hold anything (NaN, unmapped 0). Scores are scaled by sm_scale and
    accumulated in fp32; returns `out` (allocated like q if None) [total_q, q_heads, head_dim] in q's dtype.
    qo_indptr ([B], request b's first row of q; the exclusive cumsum of q_lens) may be given once per forward
    instead of being computed per layer; the torch reference walks q in order and does not need it.
    """
    if q.is_cuda:
        fn = paged_attention_triton
    elif bool((q_lens == 1).all()) and q.shape[0] * int(kv_lens.max()) * k_cache[0].numel() <= DECODE_GATHER_LIMIT:
        return decode_attention_torch(
            q,
            k_cache,
            v_cache,
            req_to_token,
            rows,
            q_starts,
            kv_lens,
            sm_scale,
            window=window,
            mapping=mapping,
            out=out,
        )  # every q_len is 1: a decode step
    else:
        fn = paged_attention_torch
    return fn(
        q,
        k_cache,
        v_cache,
        req_to_token,
        rows,
        q_starts,
        q_lens,
        kv_lens,
        sm_scale,
        window=window,
        mapping=mapping,
        out=out,
        qo_indptr=qo_indptr,
    )
