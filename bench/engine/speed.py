"""Decode speed of modeld's engine as served and ablated, against Hugging Face `generate`, side by side in one run.

Rows: plain (no draft) and DFLASH as served (--rows), and one more for each --ablate, the as-served configuration
with fields of modeld's Tuning or its flags disable_cuda_graph and speculative_disable_by_batch_size changed
(bench.common.rows). Each is measured at batch 1 and at each --concurrency, with a per-step breakdown (forward,
draft, sampling, memd, host) and MBU, and, for rows with CUDA graphs, with requests that sample (temperature 0.8)
at each --sampled-concurrency. For example, plain and DFLASH as served, each also at one step a replay and without
the overlap, and DFLASH verifying at every step (its policy off):

    python -m bench.engine.speed --ablate steps_per_replay=1 --ablate overlap_decode=false
        --ablate adaptive_speculation=false

Each kind's rows run against a memd of their own (a child process, on the GPU), started with memd's defaults for
that kind: plain rows without a draft pool (decode lookahead 32), DFLASH rows with a bounded one (lookahead 96),
since modeld takes its lookahead and prefill chunk from memd. Each row's modeld runs in this process (its engine
thread, no gRPC), so the breakdown can time its phases. Breakdown runs are separate from the throughput runs: they
synchronise the device after each phase.
"""

import argparse
import json
import pathlib
import sys
import time
from dataclasses import replace

import torch

from bench.common.requests import prompts_for
from bench.common.rows import KINDS, add_model_arguments, add_row_arguments, device_name, rows_from_args
from bench.common.served_memd import served_memd
from bench.engine.row_speed import (
    add_run_arguments,
    largest_batch,
    memd_settings,
    resolve_run_arguments,
    run_row,
)
from bench.engine.speed_report import report


def hf_generate(args, prompts, ignore_eos: bool) -> float:
    from transformers import AutoConfig, AutoModelForCausalLM

    if args.load_format == "dummy":
        with torch.device(args.device):  # random weights drawn on the GPU: an 8B model in seconds
            hf = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(args.target), dtype=torch.bfloat16)
    else:
        hf = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.bfloat16)
    hf = hf.to(args.device).eval()
    synchronise = torch.cuda.synchronize if args.device == "cuda" else lambda: None
    tokens = seconds = 0
    for p in prompts[: args.batch1]:
        ids = torch.tensor([p], device=args.device)
        extra = dict(min_new_tokens=args.new_tokens) if ignore_eos else {}
        synchronise()
        begin = time.perf_counter()
        out = hf.generate(
            ids, max_new_tokens=args.new_tokens, do_sample=False, attention_mask=torch.ones_like(ids), **extra
        )
        synchronise()
        seconds += time.perf_counter() - begin
        tokens += out.shape[1] - ids.shape[1]
    del hf
    torch.cuda.empty_cache()
    return tokens / seconds


def parse_args(argv=None) -> argparse.Namespace:
    """The command line, with args.rows the rows to run (bench.common.rows.Row)."""
    p = argparse.ArgumentParser(
        prog="python -m bench.engine.speed", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_model_arguments(p)
    add_run_arguments(p, batch1=4, concurrency="16,64", sampled_concurrency="1,16", rounds=3)
    add_row_arguments(p)
    p.add_argument("--skip-hf", action="store_true")
    p.add_argument("--json", help="write the rows here too")
    p.add_argument(
        "--simulate-accept",
        metavar="LENGTHS",
        help="comma-separated mean accept lengths: each DFLASH row runs once at each, its verify steps committing a "
        "drawn number of drafts whatever the tokens (bench.common.simulated_acceptance); such rows say 'simulated'",
    )
    args = p.parse_args(argv)
    args.rows = rows_from_args(p, args)
    if args.simulate_accept:
        try:
            lengths = [float(x) for x in args.simulate_accept.split(",")]
        except ValueError:
            p.error(f"--simulate-accept: {args.simulate_accept!r} is not comma-separated numbers")
        if any(x < 1 for x in lengths):
            p.error("--simulate-accept: an accept length counts the bonus token: at least 1")
        if not any(row.kind == "dflash" for row in args.rows):
            p.error("--simulate-accept needs a DFLASH row")
        args.rows = [
            replace(row, simulated_accept=x) for row in args.rows for x in (lengths if row.kind == "dflash" else [None])
        ]
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    ignore_eos = resolve_run_arguments(args)
    prompts = prompts_for(args.target, args.load_format, largest_batch(args))
    hf = None if args.skip_hf else hf_generate(args, prompts, ignore_eos=ignore_eos)
    measured = []
    for kind in KINDS:
        mine = [row for row in args.rows if row.kind == kind]
        if not mine:
            continue
        with served_memd(kind, memd_settings(args)) as memd:
            for row in mine:
                measured.append(run_row(row, memd, args, prompts, ignore_eos=ignore_eos))
                print(json.dumps(measured[-1]), flush=True)
    print(report(measured, hf, args, device_name(args.device)))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"hf": hf, "rows": measured}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
