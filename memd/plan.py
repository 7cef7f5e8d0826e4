"""From a MemdConfig to the pool plan: geometry, validation, budget and sizes."""

import logging
import os
from dataclasses import dataclass

from memd.buffers import CUDA_DEVICE
from memd.config import MemdConfig
from memd.geometry import GeometryError, ModelGeometry, read_config, read_geometry
from memd.sizing import (
    DraftShape,
    PoolSizes,
    SizingError,
    request_cap,
    size_from_budget,
    size_from_tokens,
    validate_ratio,
)

log = logging.getLogger("memd")

DEFAULT_MEM_FRACTION = {"cuda": 0.4, "cpu": 0.05}


class ConfigError(ValueError):
    """A configuration memd refuses to start with."""


@dataclass(frozen=True)
class PoolPlan:
    target: ModelGeometry  # one tensor-parallel rank's share of the heads (all of them with one rank)
    draft: ModelGeometry | None
    kv_dtype: str
    sizes: PoolSizes
    page_size: int
    block_size: int  # 0 without a draft
    window: int  # 0 unless ratio < 1 or given
    eviction_interval: int
    decode_lookahead: int
    max_running_requests: int
    context_len: int
    chunked_prefill_size: int
    tensor_parallel_size: int = 1

    @property
    def bounded_draft(self) -> bool:
        return self.draft is not None and self.sizes.ratio < 1


def validate(cfg: MemdConfig, target: ModelGeometry, draft: ModelGeometry | None, block: int) -> None:
    """The upstream change's checks, each with its own message."""
    try:
        validate_ratio(cfg.draft_kv_ratio)
    except SizingError as exc:
        raise ConfigError(str(exc)) from None
    if cfg.draft_kv_ratio == 1:
        return
    if draft is None:
        raise ConfigError("--draft-kv-ratio below 1 needs a DFLASH draft (--draft-model)")
    if cfg.draft_window is None:
        raise ConfigError("--draft-kv-ratio below 1 requires --draft-window")
    if cfg.draft_window < block:
        raise ConfigError(f"--draft-window {cfg.draft_window} is smaller than the draft block size {block}")
    if not draft.all_sliding:
        raise ConfigError(
            "--draft-kv-ratio below 1 requires every draft layer to be sliding_attention, "
            f"got layer_types={list(draft.layer_types)}"
        )
    if target.has_sliding_layers:
        raise ConfigError("--draft-kv-ratio below 1 is not supported on a target with sliding-window layers of its own")


def device_free_bytes(cfg: MemdConfig) -> int:
    """Free bytes one rank may take a fraction of: the device's on CUDA; on the CPU the host's shared memory, which
    every rank's pools share (so a rank's part of it)."""
    if cfg.device == "cuda":
        import cupy

        with cupy.cuda.Device(CUDA_DEVICE):
            free, _ = cupy.cuda.runtime.memGetInfo()
        return int(free)
    shm = os.statvfs("/dev/shm")
    with open("/proc/meminfo") as f:
        available = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    return min(available, shm.f_bavail * shm.f_frsize) // cfg.tensor_parallel_size


def make_plan(cfg: MemdConfig) -> PoolPlan:
    ranks = cfg.tensor_parallel_size
    if ranks > 1 and cfg.device == "cuda":
        raise ConfigError(
            "--tensor-parallel-size above 1 runs on the CPU (shared memory) only: pools on several CUDA devices "
            "are not built yet"
        )
    try:
        target = read_geometry(cfg.target_model).shard(ranks, "target")
        draft = read_geometry(cfg.draft_model, draft=True).shard(ranks, "draft") if cfg.draft_model else None
    except GeometryError as exc:
        raise ConfigError(str(exc)) from None
    block = draft.block_size if draft else 0  # modeld verifies blocks of at most the draft's own
    validate(cfg, target, draft, block)
    # auto: the checkpoint's dtype on CUDA; float32 on CPU, where modeld computes in float32.
    kv_dtype = (
        cfg.kv_cache_dtype if cfg.kv_cache_dtype != "auto" else (target.dtype if cfg.device == "cuda" else "float32")
    )
    shape = None
    cap = 0
    if draft is not None:
        window = cfg.draft_window or 0
        shape = DraftShape(
            draft.kv_bytes_per_token(kv_dtype), block, window, cfg.draft_eviction_interval, cfg.decode_lookahead
        )
        if cfg.draft_kv_ratio < 1:
            cap = request_cap(shape, cfg.page_size, cfg.max_running_requests, cfg.chunked_prefill_size)
    target_cost = target.kv_bytes_per_token(kv_dtype)
    try:
        if cfg.max_total_tokens is not None:
            sizes = size_from_tokens(cfg.max_total_tokens, target_cost, shape, cfg.draft_kv_ratio, cfg.page_size, cap)
        else:
            budget = cfg.kv_budget_bytes
            if budget is None:
                fraction = cfg.mem_fraction or DEFAULT_MEM_FRACTION[cfg.device]
                budget = int(device_free_bytes(cfg) * fraction)
            sizes = size_from_budget(budget, target_cost, shape, cfg.draft_kv_ratio, cfg.page_size, cap)
    except SizingError as exc:
        raise ConfigError(str(exc)) from None
    context = cfg.context_length or read_config(cfg.target_model).get("max_position_embeddings")
    if not isinstance(context, int) or context <= 0:
        raise ConfigError("the target's config.json has no max_position_embeddings; pass --context-length")
    return PoolPlan(
        target=target,
        draft=draft,
        kv_dtype=kv_dtype,
        sizes=sizes,
        page_size=cfg.page_size,
        block_size=block,
        # At ratio 1 the window is the draft's own (reported, not enforced by memd).
        window=cfg.draft_window or (draft.sliding_window or 0 if draft else 0),
        eviction_interval=cfg.draft_eviction_interval,
        decode_lookahead=cfg.decode_lookahead,
        max_running_requests=cfg.max_running_requests,
        context_len=min(context, sizes.target_tokens),
        chunked_prefill_size=cfg.chunked_prefill_size,
        tensor_parallel_size=ranks,
    )


def log_plan(plan: PoolPlan) -> None:
    target_bytes, draft_bytes = plan.sizes.kv_bytes()
    if plan.tensor_parallel_size > 1:
        log.info(
            "%d tensor-parallel ranks: one pool each of %d target KV heads, the same slots on every rank; bytes below "
            "are one rank's",
            plan.tensor_parallel_size,
            plan.target.kv_heads,
        )
    log.info(
        "target KV pool: tokens=%d, bytes=%d (%d per token, %s, %d layers)",
        plan.sizes.target_tokens,
        target_bytes,
        plan.sizes.target_bytes_per_token,
        plan.kv_dtype,
        plan.target.layers,
    )
    if plan.draft is not None:
        log.info(plan.sizes.log_line(plan.window))
        log.info("draft KV pool bytes=%d (%d per token)", draft_bytes, plan.sizes.draft_bytes_per_token)
