"""modeld's command line and its frozen configuration."""

import argparse
from dataclasses import dataclass

from memd import defaults
from memd.addresses import check_address
from memd.config import add_metrics_arguments
from modeld.engine.tuning import Tuning, tuning_from_environment


@dataclass(frozen=True)
class ModeldConfig:
    device: str = "cpu"
    memd: str = ""
    listen: str = ""
    target_model: str = ""
    draft_model: str | None = None
    speculative_algorithm: str = "none"
    num_draft_tokens: int | None = None  # overrides the draft's block size
    load_format: str = "auto"
    dtype: str = "auto"  # auto: memd's KV dtype
    disable_cuda_graph: bool = False  # CUDA graphs of decode and verify steps (on CUDA only)
    speculative_disable_by_batch_size: int = 0  # a hard cap: DFLASH never verifies with this many running (0: none)
    max_open_streams: int | None = None  # open Generate streams at once (default: 4 x memd's request cap)
    stream_interval: int = 1  # new tokens a stream's chunk waits for (the last goes when the request ends)
    connect_timeout: float = 60.0
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = None  # None: no metrics endpoint
    log_level: str = "INFO"
    tuning: Tuning = Tuning()  # the engine's knobs (modeld.engine.tuning): MODELD_TUNING, never flags

    def __post_init__(self):
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"--device must be cpu or cuda, got {self.device!r}")
        if self.speculative_algorithm not in ("none", "dflash"):
            raise ValueError(f"unknown --speculative-algorithm {self.speculative_algorithm!r}")
        if self.speculative_algorithm == "dflash" and not self.draft_model:
            raise ValueError("--speculative-algorithm dflash needs --draft-model")
        if self.num_draft_tokens is not None and self.num_draft_tokens < 2:
            raise ValueError("--num-draft-tokens must be >= 2")
        if self.dtype not in ("auto", "bfloat16", "float16", "float32"):
            raise ValueError(f"bad --dtype {self.dtype!r}")
        if self.speculative_disable_by_batch_size < 0:
            raise ValueError("--speculative-disable-by-batch-size must be >= 0")
        if self.stream_interval < 1:
            raise ValueError("--stream-interval must be >= 1")
        if self.max_open_streams is not None and self.max_open_streams < 1:
            raise ValueError("--max-open-streams must be >= 1")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ValueError("--metrics-port must be in 0..65535")
        if not self.connect_timeout > 0:
            raise ValueError(f"--connect-timeout must be > 0 seconds, got {self.connect_timeout}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="modeld", description="model daemon: target forward over memd's KV pools")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--memd", help="memd's address (default: its owner-only Unix socket)")
    p.add_argument("--listen", help="unix:///path or 127.0.0.1:PORT (default: an owner-only Unix socket)")
    p.add_argument("--target-model", help="HF folder or .gguf file (default: the project's SmolLM2-135M-Instruct)")
    p.add_argument(
        "--draft-model",
        help="DFLASH draft folder, or 'default' for the project's draft (default: the "
        "project's draft on CUDA with the default target, else none)",
    )
    p.add_argument(
        "--speculative-algorithm",
        choices=["none", "dflash"],
        help="default: dflash when there is a draft (given or by default), else none",
    )
    p.add_argument("--num-draft-tokens", type=int, help="DFLASH block size (default: the draft's block_size)")
    p.add_argument(
        "--speculative-disable-by-batch-size",
        type=int,
        default=0,
        help="a hard cap, as SGLang's flag: DFLASH never verifies blocks while this many requests run. Below it, "
        "modeld verifies where it measures that verifying commits more tokens a second than plain decoding "
        "(modeld.spec.policy); 0: no cap",
    )
    p.add_argument("--load-format", choices=["auto", "dummy"], default="auto")
    p.add_argument(
        "--dtype",
        choices=["auto", "bfloat16", "float16", "float32"],
        default="auto",
        help="auto: memd's KV dtype (memd's --kv-cache-dtype must match any other choice)",
    )
    p.add_argument(
        "--max-open-streams",
        type=int,
        help="open Generate streams at once; more are refused with RESOURCE_EXHAUSTED "
        "(default: 4 x memd's --max-running-requests)",
    )
    p.add_argument(
        "--stream-interval",
        type=int,
        default=1,
        help="new tokens a stream's chunk waits for before it is sent (a request's last chunk goes when it "
        "ends): larger values send fewer, larger messages, for more tokens/s over many streams at "
        "the cost of coarser streaming (default 1: every step's tokens as they come)",
    )
    p.add_argument(
        "--disable-cuda-graph",
        action="store_true",
        help="run every step eagerly (default on CUDA: decode and DFLASH verify steps replay CUDA graphs)",
    )
    p.add_argument("--connect-timeout", type=float, default=60.0, help="seconds to wait for memd at start")
    add_metrics_arguments(p)
    p.add_argument("--log-level", default="INFO")
    return p


def config_from_args(argv=None) -> ModeldConfig:
    from memd.config import resolve_device

    args = build_parser().parse_args(argv)
    for flag, address, listening in (("--listen", args.listen, True), ("--memd", args.memd, False)):
        if address is not None:
            check_address(flag, address, listening)
    device = resolve_device(args.device)
    draft = args.draft_model
    if (
        draft is None
        and args.speculative_algorithm != "none"
        and args.load_format == "auto"
        and defaults.dflash_by_default(device, args.target_model)
    ):
        draft = (
            "default"  # DFLASH by default (memd.defaults: it beat plain decoding on the H200); memd's default matches
        )
    draft = None if draft is None else defaults.draft_folder(draft)
    return ModeldConfig(
        device=device,
        memd=args.memd or defaults.default_memd_address(),
        listen=args.listen or defaults.default_modeld_address(),
        target_model=args.target_model or str(defaults.default_target_dir()),
        draft_model=draft,
        speculative_algorithm=args.speculative_algorithm or ("dflash" if draft else "none"),
        num_draft_tokens=args.num_draft_tokens,
        speculative_disable_by_batch_size=args.speculative_disable_by_batch_size,
        load_format=args.load_format,
        dtype=args.dtype,
        disable_cuda_graph=args.disable_cuda_graph,
        max_open_streams=args.max_open_streams,
        stream_interval=args.stream_interval,
        connect_timeout=args.connect_timeout,
        metrics_host=args.metrics_port[0] if args.metrics_port else "127.0.0.1",
        metrics_port=args.metrics_port[1] if args.metrics_port else None,
        log_level=args.log_level,
        tuning=tuning_from_environment(),
    )
