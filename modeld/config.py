"""modeld's command line and its frozen configuration."""

import argparse
from dataclasses import dataclass

from memd import defaults
from memd.addresses import check_address
from memd.config import add_metrics_arguments

# Graphs of one request's prompt chunk (bucket 1), padded up to the smallest that holds it; longer chunks run eagerly
# (modeld.runner.graphs).
PROMPT_TOKENS = (16, 32, 64, 128)


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
    chunked_prefill_size: int = 512
    # decode positions memd grants ahead of need, so most steps make no memd call; None: 32, or 96 with DFLASH
    # (memd.defaults.default_decode_lookahead; lowered to memd's where its bounded draft pool holds no more)
    decode_lookahead: int | None = None
    disable_cuda_graph: bool = False  # CUDA graphs of decode and verify steps (on CUDA only)
    disable_skinny_linear: bool = False  # projections of <= 16 rows on cuBLAS instead of the skinny Triton kernel
    disable_norm_fusion: bool = False  # with the skinny kernel: norms, SiLU-mul, rotary as kernels of their own
    steps_per_replay: int = (
        4  # decode (greedy DFLASH: verify) steps a graph replay, or a chain of them, runs back to back
    )
    # queue a plain decode step before committing the one before it (modeld.runner.step_ahead); None: on CUDA only (on the
    # CPU the queued step would run before the last one streams: later tokens, no overlap)
    overlap_decode: bool | None = None
    # with CUDA graphs: a lone prompt chunk of at most this many tokens runs in a step of its own while requests
    # decode (a graph of one request instead of an eager step of the batch); 0: off; None: the largest prompt graph
    # with CUDA graphs, else off
    alone_prompt_tokens: int | None = None
    speculative_disable_by_batch_size: int = 16  # DFLASH verifies only while fewer requests run (0: always)
    # the same while any running request samples (fewer drafts accepted, one verify step a replay): with the shipped
    # draft sampled speculation paid only alone (BENCHMARKS.md, twenty-first session)
    speculative_disable_sampled_by_batch_size: int = 2
    max_open_streams: int | None = None  # open Generate streams at once (default: 4 x memd's request cap)
    stream_interval: int = 1  # new tokens a stream's chunk waits for (the last goes when the request ends)
    connect_timeout: float = 60.0
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = None  # None: no metrics endpoint
    log_level: str = "INFO"

    @property
    def overlaps_decode(self) -> bool:
        return self.device == "cuda" if self.overlap_decode is None else self.overlap_decode

    def __post_init__(self):
        if self.decode_lookahead is None:
            object.__setattr__(
                self, "decode_lookahead", defaults.default_decode_lookahead(self.speculative_algorithm == "dflash")
            )
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
        if self.chunked_prefill_size < 1:
            raise ValueError("--chunked-prefill-size must be >= 1")
        if self.decode_lookahead < 0:
            raise ValueError("--decode-lookahead must be >= 0")
        if self.steps_per_replay < 1:
            raise ValueError("--steps-per-replay must be >= 1")
        if self.alone_prompt_tokens is not None and not 0 <= self.alone_prompt_tokens <= max(PROMPT_TOKENS):
            raise ValueError(f"--alone-prompt-tokens must lie in [0, {max(PROMPT_TOKENS)}] (the largest prompt graph)")
        if self.speculative_disable_by_batch_size < 0:
            raise ValueError("--speculative-disable-by-batch-size must be >= 0")
        if self.speculative_disable_sampled_by_batch_size < 0:
            raise ValueError("--speculative-disable-sampled-by-batch-size must be >= 0")
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
        default=16,
        help="DFLASH verifies blocks only while fewer requests than this run; a larger batch decodes "
        "plainly, still writing the draft's context (with the shipped draft DFLASH wins at batch 1 "
        "and loses with many requests running: BENCHMARKS.md); 0: always speculate",
    )
    p.add_argument(
        "--speculative-disable-sampled-by-batch-size",
        type=int,
        default=2,
        help="the same while any running request samples (temperature > 0: fewer drafts accepted, verify "
        "steps one a graph replay); default 2: sampled requests speculate alone only; 0: always",
    )
    p.add_argument("--load-format", choices=["auto", "dummy"], default="auto")
    p.add_argument(
        "--dtype",
        choices=["auto", "bfloat16", "float16", "float32"],
        default="auto",
        help="auto: memd's KV dtype (memd's --kv-cache-dtype must match any other choice)",
    )
    p.add_argument("--chunked-prefill-size", type=int, default=512)
    p.add_argument(
        "--decode-lookahead",
        type=int,
        help="decode positions memd grants a request ahead of need: most decode steps then make no memd "
        "call (0: one call per step, exactly what the step needs); default 32, or 96 with DFLASH (a "
        "graph replay of four verify blocks)",
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
    p.add_argument(
        "--disable-skinny-linear",
        action="store_true",
        help="run the target's projections of a few rows (batch-1 decode, one request's DFLASH block) on "
        "cuBLAS (default on CUDA: the skinny Triton kernel, one launch that streams each weight once)",
    )
    p.add_argument(
        "--disable-norm-fusion",
        action="store_true",
        help="with the skinny kernel, run the residual add + RMSNorm before q|k|v and gate|up, the "
        "SiLU-mul after gate|up and the rotary + K/V write after q|k|v as kernels of their own "
        "(default: inside the skinny projection, one launch instead of two or three)",
    )
    p.add_argument(
        "--steps-per-replay",
        type=int,
        default=4,
        help="decode steps (greedy DFLASH: verify steps) run back to back, each fed the last, before "
        "their tokens reach the host: in one CUDA graph replay for greedy batches, as a chain of "
        "one-step replays for requests that sample and for a target's plain decodes with a draft; a "
        "batch of 16 or more (greedy verify steps: any batch) runs them when its every request holds "
        "the slots they reach (the decode lookahead). Tokens then stream in groups of that many "
        "steps; 1: one step at a time",
    )
    p.add_argument(
        "--disable-overlap-decode",
        action="store_true",
        help="commit each plain decode step before queueing the next (default on CUDA: the next step of "
        "an unchanged batch is queued on the device first, so the host commits and streams one step "
        "while the GPU computes the next)",
    )
    p.add_argument(
        "--alone-prompt-tokens",
        type=int,
        help="with CUDA graphs, run a lone prompt chunk of at most this many tokens (up to 128) in a step "
        "of its own while requests decode: it replays a graph of one request instead of an eager "
        "step of the whole batch, and the decodes wait that step (never two in a row). It paid "
        "1.03-1.20x tokens/s for the default model, plain and DFLASH, on an H100 (BENCHMARKS.md); for "
        "a large model it may cost a step per arrival (not measured). 0: off. Default: 128 with CUDA "
        "graphs, else off",
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
        speculative_disable_sampled_by_batch_size=args.speculative_disable_sampled_by_batch_size,
        load_format=args.load_format,
        dtype=args.dtype,
        chunked_prefill_size=args.chunked_prefill_size,
        decode_lookahead=args.decode_lookahead,
        disable_cuda_graph=args.disable_cuda_graph,
        disable_skinny_linear=args.disable_skinny_linear,
        disable_norm_fusion=args.disable_norm_fusion,
        steps_per_replay=args.steps_per_replay,
        overlap_decode=False if args.disable_overlap_decode else None,
        alone_prompt_tokens=args.alone_prompt_tokens,
        max_open_streams=args.max_open_streams,
        stream_interval=args.stream_interval,
        connect_timeout=args.connect_timeout,
        metrics_host=args.metrics_host,
        metrics_port=args.metrics_port,
        log_level=args.log_level,
    )
