"""bench.memd.pool_payoff's memd side: memd's command line and configuration at a ratio, the formula's pools for
it (memd.sizing, with the inputs memd.plan gives it), and the pools as memd's Capacity and start-up log report them."""

import re
from dataclasses import dataclass

from memd.addresses import unix_path
from memd.config import MemdConfig, config_from_args
from memd.geometry import read_config, read_geometry
from memd.sizing import DraftShape, PoolSizes, page_ceil, page_floor, request_cap, size_from_budget

POOL_SHARE = re.compile(r"pool/([1-9][0-9]*)")
NOWHERE = "unix:///nowhere/memd.sock"  # a --listen for reading memd's configuration: nothing binds it
LOG_FIGURES = {  # memd's start-up lines (memd.plan.log_plan) and the figures they carry
    "target_tokens": r"target KV pool: tokens=(\d+)",
    "target_bytes": r"target KV pool: tokens=\d+, bytes=(\d+)",
    "draft_tokens": r"draft KV pool: window=\d+, ratio=\S+, tokens=(\d+)",
    "request_cap": r"draft KV pool: .*\(request cap (\d+)",
    "draft_bytes": r"draft KV pool bytes=(\d+)",
}


def pool_flags(args, ratio: float) -> list[str]:
    """memd's flags for a ratio besides --device and --target-model (memd's defaults for those not given)."""
    values = {
        "--draft-model": args.draft,
        "--draft-kv-ratio": ratio,
        "--draft-window": args.draft_window,
        "--kv-budget-bytes": args.kv_budget_bytes,
        "--page-size": args.page_size,
        "--max-running-requests": args.max_running_requests,
        "--chunked-prefill-size": args.chunked_prefill_size,
        "--decode-lookahead": args.decode_lookahead,
        "--draft-eviction-interval": args.draft_eviction_interval,
    }
    return [word for flag, value in values.items() if value is not None for word in (flag, str(value))]


def memd_flags(args, ratio: float) -> list[str]:
    """memd's whole command line for a ratio, but --listen."""
    return ["--device", args.device, "--target-model", args.target, *pool_flags(args, ratio)]


def memd_config(args, ratio: float) -> MemdConfig:
    """The configuration memd makes of those flags: its defaults filled in (lookahead, chunk, eviction interval)."""
    return config_from_args([*memd_flags(args, ratio), "--listen", NOWHERE])


def kv_dtype(cfg: MemdConfig, checkpoint_dtype: str) -> str:
    """memd's KV dtype: --kv-cache-dtype; auto is the checkpoint's dtype on CUDA, float32 on the CPU."""
    if cfg.kv_cache_dtype != "auto":
        return cfg.kv_cache_dtype
    return checkpoint_dtype if cfg.device == "cuda" else "float32"


def formula_sizes(cfg: MemdConfig) -> PoolSizes:
    """memd.sizing's pools for memd's configuration: the inputs memd's plan gives it (memd.plan.make_plan)."""
    target = read_geometry(cfg.target_model)
    draft = read_geometry(cfg.draft_model, draft=True)
    dtype = kv_dtype(cfg, target.dtype)
    shape = DraftShape(
        draft.kv_bytes_per_token(dtype),
        draft.block_size,
        cfg.draft_window,
        cfg.draft_eviction_interval,
        cfg.decode_lookahead,
    )
    bounded = cfg.draft_kv_ratio < 1
    cap = request_cap(shape, cfg.page_size, cfg.max_running_requests, cfg.chunked_prefill_size) if bounded else 0
    return size_from_budget(
        cfg.kv_budget_bytes, target.kv_bytes_per_token(dtype), shape, cfg.draft_kv_ratio, cfg.page_size, cap
    )


def resolve_context(entry: str, largest_pool: int, page: int) -> int:
    """A --contexts entry in tokens: pool/N is the N-th part of a target pool of `largest_pool` tokens, in whole
    pages: a context of which N requests fit at once there (pool/1: the whole pool)."""
    share = POOL_SHARE.fullmatch(entry)
    return page_floor(largest_pool // int(share[1]), page) if share else int(entry)


def context_limit(args, sizes: PoolSizes) -> int:
    """memd's context length: the target's max_position_embeddings, at most the target pool."""
    return min(read_config(args.target)["max_position_embeddings"], sizes.target_tokens)


def pool_holds(target_tokens: int, context: int, page: int) -> int:
    """The formula: requests of `context` tokens the target pool holds at once, each holding the pages of every
    position but its last (whose K/V is never computed)."""
    return target_tokens // page_ceil(context - 1, page)


@dataclass(frozen=True)
class PoolFigures:
    target_tokens: int
    target_bytes: int
    draft_tokens: int
    draft_bytes: int
    request_cap: int


def formula_figures(sizes: PoolSizes) -> PoolFigures:
    target_bytes, draft_bytes = sizes.kv_bytes()
    return PoolFigures(sizes.target_tokens, target_bytes, sizes.draft_tokens, draft_bytes, sizes.request_cap)


def capacity_figures(capacity: dict) -> PoolFigures:
    """memd's pools as its Capacity answers (client.memd_admin.memd_capacity)."""
    target, draft = capacity["target"], capacity["draft"]
    return PoolFigures(target["total"], target["bytes"], draft["total"], draft["bytes"], capacity["request_cap"])


def log_figures(log: str) -> PoolFigures | None:
    """memd's pools as its start-up log gives them; None when a line is missing."""
    found = {name: re.search(pattern, log) for name, pattern in LOG_FIGURES.items()}
    if not all(found.values()):
        return None
    return PoolFigures(**{name: int(match[1]) for name, match in found.items()})


def memd_log(address: str) -> str:
    """memd's log: bench.common.memd_process (and the tests' run_memd) write it beside memd's socket."""
    socket = unix_path(address)
    log = socket.with_name("memd.log") if socket else None
    return log.read_text() if log and log.exists() else ""
