"""DFLASH as served against plain as served, in alternating runs (plain, DFLASH, then DFLASH, plain, ...): the
tokens/s ratio of each adjacent pair at batch 1 and at each concurrency, greedy and sampled, and the median and
range of those ratios. One bench.engine.speed run compares cells of about half a second each, and rows that should
agree moved by up to 20% from one run to the next on one machine (docs/benchmarks-history.md): telling a few percent
apart (is DFLASH at 16 as fast as plain?) needs several pairs.

    python -m bench.engine.paired_speed [--pairs 4] [--concurrency 16] [--sampled-concurrency 16] [--rounds 4]
        [--batch1 1] [--new-tokens 128] [--ignore-eos] [--target DIR] [--load-format dummy] [--draft DIR]

Each run builds its configuration's engine afresh, as bench.engine.speed's rows do, against a memd of its kind (two
child processes: plain's without a draft pool, DFLASH's with one, each with memd's defaults for that kind), and
skips that bench's per-step breakdown. Both configurations first run once unmeasured: a fresh
machine's first run compiles Triton's kernels for the workload's shapes (on one machine the first run's plain
batch-1 row came out at 0.64x the next one's).
"""

import argparse
import contextlib
import json
import statistics
import sys

from bench.common.requests import prompts_for
from bench.common.rows import KINDS, Row, add_model_arguments, device_name
from bench.common.served_memd import served_memd
from bench.engine.row_speed import add_run_arguments, largest_batch, memd_settings, resolve_run_arguments, run_row


def run_order(pairs: int) -> list[str]:
    """The configurations' run order: each pair once plain first, once DFLASH first, so that drift over the run
    (clocks, caches, a neighbour's load) falls on both alike."""
    return [kind for i in range(pairs) for kind in (KINDS if i % 2 == 0 else KINDS[::-1])]


def metrics(args) -> list[tuple[str, str]]:
    """(label, row key) of every tokens/s figure a run measures."""
    return [
        ("batch 1", "bs1"),
        *((f"{c} concurrent", f"c{c}") for c in args.concurrency),
        *((f"{c} concurrent, sampled", f"sampled{c}") for c in args.sampled_concurrency),
    ]


def pair_ratios(runs: list[dict], key: str) -> list[float]:
    """DFLASH over plain tokens/s at `key` for each adjacent pair of runs (in run_order's order)."""
    pairs = [runs[i : i + 2] for i in range(0, len(runs) - 1, 2)]
    return [
        next(r for r in pair if r["kind"] == "dflash")[key] / next(r for r in pair if r["kind"] == "plain")[key]
        for pair in pairs
    ]


def report(runs: list[dict], args) -> str:
    """The ratio of every pair, their median and range; then each configuration's median tokens/s."""
    pairs, measured = len(runs) // 2, metrics(args)
    lines = [
        "| DFLASH / plain, tokens/s | " + " | ".join(f"pair {i + 1}" for i in range(pairs)) + " | median | range |",
        "|---|" + "---|" * (pairs + 2),
    ]
    for label, key in measured:
        ratios = pair_ratios(runs, key)
        lines.append(
            f"| {label} | "
            + " | ".join(f"{r:.2f}" for r in ratios)
            + f" | {statistics.median(ratios):.2f} | {min(ratios):.2f}-{max(ratios):.2f} |"
        )
    lines += [
        "",
        "| median tokens/s | " + " | ".join(label for label, _ in measured) + " |",
        "|---|" + "---|" * len(measured),
    ]
    for kind in KINDS:
        mine = [r for r in runs if r["kind"] == kind]
        lines.append(
            f"| {kind} as served | "
            + " | ".join(f"{statistics.median(r[key] for r in mine):.1f}" for _, key in measured)
            + " |"
        )
    accept = [r["accept"] for r in runs if r["kind"] == "dflash" and r["accept"]]
    if accept:
        lines.append(f"\nDFLASH's accept length at batch 1: {statistics.median(accept):.2f} (the median of its runs)")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.engine.paired_speed", description=__doc__.splitlines()[0])
    add_model_arguments(p)
    add_run_arguments(p, batch1=1, concurrency="16", sampled_concurrency="16", rounds=4)
    p.add_argument("--pairs", type=int, default=4)
    args = p.parse_args(argv)
    if args.pairs < 1:
        p.error("--pairs must be at least 1")
    if args.draft == "none":
        p.error("a paired run compares DFLASH with plain decoding: it needs a draft")
    ignore_eos = resolve_run_arguments(args)
    prompts = prompts_for(args.target, args.load_format, largest_batch(args))
    runs = []
    with contextlib.ExitStack() as stack:
        memd = {kind: stack.enter_context(served_memd(kind, memd_settings(args))) for kind in KINDS}
        for kind in KINDS:  # unmeasured: kernels compiled, caches filled
            run_row(Row(kind), memd[kind], args, prompts, ignore_eos=ignore_eos, breakdown=False)
        for kind in run_order(args.pairs):
            runs.append(run_row(Row(kind), memd[kind], args, prompts, ignore_eos=ignore_eos, breakdown=False))
            print(json.dumps(runs[-1]), flush=True)
    print(f"{device_name(args.device)}; target {args.target} ({args.load_format}), draft {args.draft}\n")
    print(report(runs, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
