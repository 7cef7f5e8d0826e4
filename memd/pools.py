"""Create the shared buffers of a PoolPlan and the SlotManager that hands out their slots.

Buffers (rows include the sink page 0, which is never handed out); with tensor parallelism a target_kv and a
draft_kv per rank, each of kv_heads / tp heads, and one set of tables for all:
    target_kv        [target layers, 2 (K, V), target rows, kv_heads, head_dim]  kv dtype
    draft_kv         [draft layers, 2, draft rows, kv_heads, head_dim]           (with a draft)
    target_to_draft  [target rows] int32, 0 = no draft slot                      (with a draft)
    req_to_token     [max_running_requests + 1, context_len] int32; row 0 unused
"""

from memd.buffers import SharedBuffers
from memd.plan import PoolPlan
from memd.slots import DraftMode, SlotManager
from protos import memd_pb2


def draft_mode(plan: PoolPlan) -> DraftMode:
    if plan.draft is None:
        return DraftMode.NONE
    return DraftMode.BOUNDED if plan.bounded_draft else DraftMode.IDENTITY


def build_pools(plan: PoolPlan, buffers: SharedBuffers, epoch: int) -> tuple[SlotManager, memd_pb2.Layout]:
    sizes, P = plan.sizes, plan.page_size
    mode = draft_mode(plan)
    target_rows = sizes.target_tokens + P
    draft_rows = sizes.draft_tokens + P if plan.draft else 0
    target_bytes, draft_bytes = sizes.kv_bytes()
    for rank in range(plan.tensor_parallel_size):
        t, g = plan.target, plan.draft
        buffers.create_kv("target_kv", plan.kv_dtype, [t.layers, 2, target_rows, t.kv_heads, t.head_dim], rank)
        if g is not None:
            buffers.create_kv("draft_kv", plan.kv_dtype, [g.layers, 2, draft_rows, g.kv_heads, g.head_dim], rank)
    mapping = None
    if plan.draft is not None:
        mapping = buffers.create_table("target_to_draft", [target_rows])
    req_to_token = buffers.create_table("req_to_token", [plan.max_running_requests + 1, plan.context_len])
    mgr = SlotManager(
        target_pages=sizes.target_tokens // P,
        draft_pages=sizes.draft_tokens // P if mode is DraftMode.BOUNDED else 0,
        page_size=P,
        mode=mode,
        window=plan.window,
        trim_gap=plan.eviction_interval * plan.block_size,
        max_requests=plan.max_running_requests,
        context_len=plan.context_len,
        mapping=mapping,
        req_to_token=req_to_token,
        on_write=buffers.write,
    )
    layout = memd_pb2.Layout(
        epoch=epoch,
        kv_dtype=plan.kv_dtype,
        page_size=P,
        target=_geometry(plan.target, sizes.target_tokens, target_rows, target_bytes, sizes.target_bytes_per_token),
        has_draft=plan.draft is not None,
        draft=_geometry(plan.draft, sizes.draft_tokens, draft_rows, draft_bytes, sizes.draft_bytes_per_token)
        if plan.draft
        else None,
        draft_kv_ratio=float(sizes.ratio),
        draft_window=plan.window,
        draft_block_size=plan.block_size,
        max_running_requests=plan.max_running_requests,
        context_len=plan.context_len,
        request_cap=sizes.request_cap,
        buffers=buffers.descs,
        target_model=plan.target.path,
        draft_model=plan.draft.path if plan.draft else "",
        chunked_prefill_size=plan.chunked_prefill_size,
        decode_lookahead=plan.decode_lookahead,
        tables_written_event=buffers.tables_written_event,
        tensor_parallel_size=plan.tensor_parallel_size,
    )
    return mgr, layout


def _geometry(g, tokens, rows, nbytes, per_token) -> memd_pb2.PoolGeometry:
    return memd_pb2.PoolGeometry(
        layers=g.layers,
        kv_heads=g.kv_heads,
        head_dim=g.head_dim,
        tokens=tokens,
        rows=rows,
        bytes=nbytes,
        bytes_per_token=per_token,
    )
