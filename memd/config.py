"""memd's command line and its frozen configuration."""

import argparse
import grp
import os
from dataclasses import dataclass

from memd import defaults
from memd.addresses import check_address, unix_path


@dataclass(frozen=True)
class MemdConfig:
    device: str = "cpu"  # cpu: POSIX shared memory; cuda: CuPy + CUDA IPC
    # ranks the KV heads are split over: one pool of kv_heads / tp heads per rank, one allocator for them all
    tensor_parallel_size: int = 1
    target_model: str = ""
    draft_model: str | None = None  # None: plain decoding, no draft pool
    draft_kv_ratio: float = 1.0
    draft_window: int | None = None
    draft_eviction_interval: int = 8  # scheduler steps between out-of-window frees
    # decode slots a client may hold ahead of need, per request (sized into the draft cap); None: by the draft
    # (memd.defaults.default_decode_lookahead)
    decode_lookahead: int | None = None
    page_size: int = 1
    max_running_requests: int = 16
    chunked_prefill_size: int = 512
    context_length: int | None = None  # default: the target's max_position_embeddings
    kv_cache_dtype: str = "auto"  # auto: the target's config dtype
    kv_budget_bytes: int | None = None
    mem_fraction: float | None = None
    max_total_tokens: int | None = None
    listen: str = ""
    allow_group: int | None = None  # gid whose members may use the Unix socket too (None: its owner and root only)
    strict: bool = False
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = None  # None: no metrics endpoint
    log_level: str = "INFO"

    def __post_init__(self):
        if self.decode_lookahead is None:
            object.__setattr__(
                self, "decode_lookahead", defaults.default_decode_lookahead(self.draft_model is not None)
            )
        budgets = [self.kv_budget_bytes, self.mem_fraction, self.max_total_tokens]
        if sum(b is not None for b in budgets) > 1:
            raise ValueError("give at most one of --kv-budget-bytes, --mem-fraction, --max-total-tokens")
        checks = [
            (self.device in ("cpu", "cuda"), f"--device must be cpu or cuda, got {self.device!r}"),
            (self.tensor_parallel_size >= 1, "--tensor-parallel-size must be >= 1"),
            (self.page_size >= 1, "--page-size must be >= 1"),
            (self.max_running_requests >= 1, "--max-running-requests must be >= 1"),
            (self.chunked_prefill_size >= 1, "--chunked-prefill-size must be >= 1"),
            (self.draft_eviction_interval >= 0, "--draft-eviction-interval must be >= 0"),
            (self.decode_lookahead >= 0, "--decode-lookahead must be >= 0"),
            (self.kv_budget_bytes is None or self.kv_budget_bytes > 0, "--kv-budget-bytes must be > 0"),
            (self.mem_fraction is None or 0 < self.mem_fraction < 1, "--mem-fraction must be in (0, 1)"),
            (self.max_total_tokens is None or self.max_total_tokens > 0, "--max-total-tokens must be > 0"),
            (
                self.context_length is None or self.context_length >= 1,
                f"--context-length must be >= 1, got {self.context_length}",
            ),
            (self.draft_window is None or self.draft_window > 0, "--draft-window must be > 0"),
            (self.kv_cache_dtype in ("auto", "bfloat16", "float16", "float32"), "bad --kv-cache-dtype"),
            (self.metrics_port is None or 0 <= self.metrics_port <= 65535, "--metrics-port must be in 0..65535"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="memd", description="KV-memory manager daemon")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="auto: cuda when a GPU is visible")
    p.add_argument("--target-model", help="Hugging Face folder (default: the project's SmolLM2-135M-Instruct)")
    p.add_argument(
        "--tensor-parallel-size",
        "--tp-size",
        type=int,
        default=1,
        help="ranks the KV heads are split over: one target (and draft) pool a rank, each of its share of the "
        "heads, with one slot allocator; --kv-budget-bytes and --mem-fraction are per rank (default 1)",
    )
    p.add_argument(
        "--draft-model",
        help="DFLASH draft folder, 'default' for the project's draft, or 'none' (default: "
        "the project's draft on CUDA with the default target, else none: no draft pool)",
    )
    p.add_argument(
        "--draft-kv-ratio",
        type=float,
        help="draft KV pool as a fraction of the target's tokens (default: 0.25 for the draft chosen by "
        "default, else 1)",
    )
    p.add_argument(
        "--draft-window",
        type=int,
        help="draft KV window in tokens (required below ratio 1; default: the draft's own for the draft "
        "chosen by default)",
    )
    p.add_argument("--draft-eviction-interval", type=int, default=8, help="steps between out-of-window draft frees")
    p.add_argument(
        "--decode-lookahead",
        type=int,
        help="decode slots a client may hold ahead of need per request; the bounded draft pool's request "
        "cap includes them (published in the layout); default 32, or 96 with a draft pool (a graph "
        "replay of four DFLASH verify blocks)",
    )
    p.add_argument("--page-size", type=int, default=1)
    p.add_argument("--max-running-requests", type=int, default=16)
    p.add_argument("--chunked-prefill-size", type=int, default=512)
    p.add_argument("--context-length", type=int)
    p.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "bfloat16", "float16", "float32"])
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--kv-budget-bytes", type=int, help="bytes for both KV pools (of each tensor-parallel rank)")
    budget.add_argument(
        "--mem-fraction",
        type=float,
        help="fraction of the device's free memory for the KV pools (on the CPU, of the shared memory each rank "
        "may have)",
    )
    budget.add_argument("--max-total-tokens", type=int, help="target pool size in tokens")
    p.add_argument("--listen", help="unix:///path or 127.0.0.1:PORT (default: an owner-only Unix socket)")
    p.add_argument(
        "--allow-group",
        metavar="GROUP",
        help="members of GROUP (a name or a gid) may attach and call too: the Unix socket is made 0660 with "
        "that group (default: 0600, memd's user and root only)",
    )
    p.add_argument("--strict", action="store_true", help="check the leak invariant after every mutating call")
    add_metrics_arguments(p)
    p.add_argument("--log-level", default="INFO")
    return p


def add_metrics_arguments(p: argparse.ArgumentParser) -> None:
    """--metrics-port, the same on both daemons."""
    p.add_argument(
        "--metrics-port",
        type=metrics_address,
        metavar="[HOST:]PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (default: off; HOST: loopback unless given; "
        "PORT 0: any free port, logged)",
    )


def metrics_address(text: str) -> tuple[str, int]:
    """--metrics-port's value: (host, port), the host loopback unless given ("[HOST:]PORT"; an IPv6 host in [])."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]") if sep else "127.0.0.1"
    try:
        number = int(port)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not [HOST:]PORT") from None
    if not host or not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not [HOST:]PORT with a port in 0..65535")
    return host, number


def resolve_device(device: str) -> str:
    if device != "auto":
        return device
    try:
        import cupy

        return "cuda" if cupy.is_available() else "cpu"
    except ImportError:
        return "cpu"


def group_id(group: str) -> int:
    """--allow-group's group, by name or number; ValueError if the system has no such group."""
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        pass
    try:
        return grp.getgrgid(int(group)).gr_gid
    except (KeyError, ValueError):
        raise ValueError(f"--allow-group {group!r}: no such group") from None


def config_from_args(argv: list[str] | None = None) -> MemdConfig:
    args = build_parser().parse_args(argv)
    if args.listen is not None:
        check_address("--listen", args.listen, listening=True)
    listen = args.listen or defaults.default_memd_address()
    if args.allow_group is not None and unix_path(listen) is None:
        raise ValueError(f"--allow-group applies to a Unix socket, not to {listen!r}: TCP has no peer check")
    # No draft pool unless asked for (a pool no client writes costs memory, and at ratio 1 it keeps a plain
    # client's prefixes out of the cache: their draft slots would hold no draft KV), or unless DFLASH is the
    # default (CUDA, the default target): the shipped draft's bounded pool, which modeld's default uses.
    device = resolve_device(args.device)
    by_default = args.draft_model is None and defaults.dflash_by_default(device, args.target_model)
    draft = defaults.draft_folder("default" if by_default else args.draft_model or "none")
    ratio = (
        args.draft_kv_ratio
        if args.draft_kv_ratio is not None
        else defaults.DEFAULT_DRAFT_KV_RATIO
        if by_default
        else 1.0
    )
    window = args.draft_window if args.draft_window is not None or not by_default else defaults.default_draft_window()
    return MemdConfig(
        device=device,
        tensor_parallel_size=args.tensor_parallel_size,
        target_model=args.target_model or str(defaults.default_target_dir()),
        draft_model=None if draft.lower() == "none" else draft,
        draft_kv_ratio=ratio,
        draft_window=window,
        draft_eviction_interval=args.draft_eviction_interval,
        decode_lookahead=args.decode_lookahead,
        page_size=args.page_size,
        max_running_requests=args.max_running_requests,
        chunked_prefill_size=args.chunked_prefill_size,
        context_length=args.context_length,
        kv_cache_dtype=args.kv_cache_dtype,
        kv_budget_bytes=args.kv_budget_bytes,
        mem_fraction=args.mem_fraction,
        max_total_tokens=args.max_total_tokens,
        listen=listen,
        allow_group=None if args.allow_group is None else group_id(args.allow_group),
        strict=args.strict or os.environ.get("MEMD_STRICT", "") not in ("", "0"),
        metrics_host=args.metrics_port[0] if args.metrics_port else "127.0.0.1",
        metrics_port=args.metrics_port[1] if args.metrics_port else None,
        log_level=args.log_level,
    )
