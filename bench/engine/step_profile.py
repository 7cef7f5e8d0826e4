"""Where a step's time goes, plain decoding against DFLASH, in one run: torch.profiler over the steps of modeld's
engine in this process (CUDA graphs as served), the ops by their own device time and by their own host time, and
per step the wall time against the device's busy time (a step whose device time is well under its wall time is
host-bound).

    python -m bench.engine.step_profile [--target DIR] [--load-format dummy] [--draft DIR] [--batch 1]
        [--new-tokens 64] [--rows 20] [--device cuda|cpu] [--steps-per-replay 1] [--disable-overlap-decode]
        [--trace PREFIX]

Each configuration runs against a memd child process of its own (plain's without a draft pool); requests are
`--batch` chat prompts generating `--new-tokens` each (EOS ignored), after a warm-up that leaves graphs captured and
kernels compiled. The engine's loop runs in this thread, not its own (the profiler records the host ops of its own
thread).
"""

import argparse
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from bench.common.memd_process import memd_process
from bench.common.requests import prompts_for, submit_requests
from modeld.config import ModeldConfig
from modeld.engine.build import build_engine
from modeld.engine.tuning import Tuning
from modeld.model.fetch_default import ensure_default_model

DEFAULT_DRAFT = "modeld/default_draft"
HOST_OR_COPY = ("aten::", "cuda", "cuLaunch", "Memcpy", "Memset")  # profiler keys of host calls and copies


def memd_flags(args, dflash: bool) -> list[str]:
    """memd for one configuration: with the draft's bounded pool for DFLASH, without a draft pool for plain, and
    otherwise memd's defaults for that kind (modeld takes its decode lookahead and prefill chunk from them)."""
    flags = [
        "--device",
        args.device,
        "--target-model",
        args.target,
        "--page-size",
        "16",
        "--max-running-requests",
        str(max(args.batch, 2)),
        "--max-total-tokens",
        "65536",
        "--kv-cache-dtype",
        "bfloat16",
    ]
    if not dflash:
        return flags + ["--draft-model", "none"]
    return flags + ["--draft-model", args.draft, "--draft-kv-ratio", "0.25", "--draft-window", "256"]


def run_in_this_thread(engine, prompts: list[list[int]], new_tokens: int, tag: str) -> tuple[int, int, int, float]:
    """The engine's loop in the calling thread (the profiler sees host ops of the thread it runs in) until every
    request completed: (steps, tokens, verify steps, seconds)."""
    reqs = submit_requests(engine, prompts, new_tokens, True, tag)
    steps, begin = 0, time.perf_counter()
    while any(r.finish is None for r in reqs):
        engine._drain_inbox()
        steps += engine._step()
    seconds = time.perf_counter() - begin
    failed = [r.finish for r in reqs if r.finish.reason == "abort"]
    assert not failed, failed
    return steps, sum(len(r.output_ids) for r in reqs), sum(r.spec_verify_ct for r in reqs), seconds


def profile_config(memd: str, args, prompts, dflash: bool) -> str:
    cfg = ModeldConfig(
        device=args.device,
        memd=memd,
        target_model=args.target,
        load_format=args.load_format,
        tuning=Tuning(
            steps_per_replay=args.steps_per_replay,
            skinny_linear=not args.disable_skinny_linear,
            norm_fusion=not args.disable_norm_fusion,
            overlap_decode=False if args.disable_overlap_decode else None,
        ),
        draft_model=args.draft if dflash else None,
        speculative_algorithm="dflash" if dflash else "none",
    )
    built = build_engine(cfg, lambda serving: None)
    engine = built.engine
    cuda = args.device == "cuda"
    try:
        run_in_this_thread(engine, prompts[:2], 8, "warm")
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=activities) as prof:
            steps, tokens, verifies, seconds = run_in_this_thread(
                engine, prompts[: args.batch], args.new_tokens, "prof"
            )
            if cuda:
                torch.cuda.synchronize()
    finally:
        engine.scheduler.memd.flush_releases()
        built.link.close()
    if args.trace:  # the timeline: where the device waits between a step's kernels and the next step's
        prof.export_chrome_trace(f"{args.trace}-{'dflash' if dflash else 'plain'}.json")
    averages = prof.key_averages()
    n = max(steps, 1)
    device_key = "self_device_time_total" if cuda else "self_cpu_time_total"
    busy = f"{sum(e.self_device_time_total for e in averages) / 1e3 / n:.2f} ms device busy" if cuda else "CPU only"
    if cuda:  # kernels alone (graph nodes included), not the host ops that launched them or copies
        kernels = sum(e.count for e in averages if e.self_device_time_total > 0 and not e.key.startswith(HOST_OR_COPY))
        busy += f", {kernels / n:.0f} kernels"
    head = (
        f"### {'DFLASH' if dflash else 'plain'}, batch {args.batch}: {steps} steps, {tokens} tokens"
        + (f", accept length {tokens / verifies:.2f}" if verifies else "")
        + f"; per step {1000 * seconds / n:.2f} ms wall (profiled), {busy}"
    )
    tables = [averages.table(sort_by=device_key, row_limit=args.rows)] if cuda else []
    tables.append(averages.table(sort_by="self_cpu_time_total", row_limit=args.rows))
    return "\n\n".join([head, *tables])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.engine.step_profile", description=__doc__.splitlines()[0])
    p.add_argument("--target", help="default: the converted default model")
    p.add_argument("--load-format", choices=["auto", "dummy"], default="auto", help="dummy: random weights (8B)")
    p.add_argument("--draft", default=DEFAULT_DRAFT)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--rows", type=int, default=20)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--disable-skinny-linear", action="store_true", help="modeld's: few-row projections on cuBLAS")
    p.add_argument("--disable-norm-fusion", action="store_true", help="modeld's: few-row norms as kernels of their own")
    p.add_argument("--steps-per-replay", type=int, default=1, help="modeld's (default here 1: a step is one forward)")
    p.add_argument(
        "--disable-overlap-decode",
        action="store_true",
        help="modeld's: each plain decode step committed before the next is queued",
    )
    p.add_argument(
        "--trace", help="also write each configuration's Chrome trace to TRACE-plain.json, TRACE-dflash.json"
    )
    args = p.parse_args(argv)
    args.target = args.target or str(ensure_default_model())
    prompts = prompts_for(args.target, args.load_format, max(args.batch, 2))
    for dflash in (False, True):
        with memd_process(*memd_flags(args, dflash)) as memd:
            print(profile_config(memd, args, prompts, dflash), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
