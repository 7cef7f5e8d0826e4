"""Clients that each send their next request when their last one completed, so that arrivals come one at a time
while the others decode (as users' do; bench.engine_speed's concurrent runs send a batch at once and wait for all of
it): tokens/s and first tokens, modeld's engine as served (a lone arrival's prompt chunk in a step of its own,
replaying a graph of one request: --alone-prompt-tokens 128 on CUDA) against every prompt chunk beside the decodes
in an eager step of the whole batch (--alone-prompt-tokens 0, as before), plain and DFLASH, and DFLASH as served
speculating only below each of --speculate-below's batch sizes, in one run, for each number of clients. Ratios are
against plain as served with as many clients.

    python -m bench.clients [--target DIR] [--load-format dummy] [--draft DIR|none] [--clients 4,8,16]
        [--requests 64] [--new-tokens 128] [--ignore-eos] [--speculate-below 16,8,4]

One memd child process on the GPU serves every configuration in turn; each runs a warm-up first, and the first
configuration runs the whole workload once unmeasured (on a fresh machine the first row otherwise paid Triton's
compiles of the prompts' shapes: a p90 first tokens of 748 ms).
"""

import argparse
import concurrent.futures
import pathlib
import statistics
import sys
import time

import torch

from bench.engine_speed import add_model_arguments, generate_all, memd_args, prompts_for
from bench.in_process import running_engine
from bench.memd_process import memd_process
from modeld.config import ModeldConfig
from modeld.engine.tuning import Tuning
from modeld.model.fetch_default import ensure_default_model


def configs(speculate_below: list[int]) -> list[tuple[str, bool, int | None, int]]:
    """(name, with the draft, --alone-prompt-tokens (None: modeld's default), --speculative-disable-by-batch-size),
    plain as served first."""
    below = ModeldConfig.speculative_disable_by_batch_size  # the field's default
    rows = [
        ("plain as served", False, None, 0),
        ("plain, prompt chunks beside the decodes (before)", False, 0, 0),
        ("DFLASH as served", True, None, below),
        ("DFLASH, prompt chunks beside the decodes (before)", True, 0, below),
    ]
    return rows + [
        (f"DFLASH as served, speculation off from {n} running", True, None, n) for n in speculate_below if n != below
    ]


def run_clients(
    engine, prompts: list[list[int]], clients: int, args, ignore_eos: bool, tag: str
) -> tuple[int, float, list[float]]:
    """`clients` threads share `args.requests` requests, each sending its next when its last completed:
    (generated tokens, seconds, each request's first tokens in ms)."""
    work = [prompts[i % len(prompts)] for i in range(args.requests)]
    firsts: list[tuple[float, int]] = []

    def client(c: int) -> int:
        return sum(
            generate_all(engine, [work[i]], args.new_tokens, ignore_eos, f"{tag}-{i}", first_tokens=firsts)[0]
            for i in range(c, len(work), clients)
        )

    begin = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        tokens = sum(pool.map(client, range(clients)))
    return tokens, time.perf_counter() - begin, [1000 * t for t, _ in firsts]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.clients", description=__doc__.splitlines()[0])
    add_model_arguments(p)
    p.add_argument("--clients", default="4,8,16", help="comma-separated numbers of clients, each a run")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--ignore-eos", action="store_true", help="every request decodes --new-tokens")
    p.add_argument(
        "--speculate-below",
        default="16,8,4",
        help="comma-separated batch sizes from which DFLASH decodes plainly, each a configuration",
    )
    args = p.parse_args(argv)
    args.target = args.target or str(ensure_default_model())
    draft = None if args.draft == "none" else args.draft
    ignore_eos = args.load_format == "dummy" or args.ignore_eos
    prompts = prompts_for(args.target, args.load_format, args.requests)
    clients = [int(n) for n in args.clients.split(",")]
    settings = argparse.Namespace(page=16, concurrency=[max(clients)], sampled_concurrency=[], ratio=0.25, window=256)
    lines = [
        f"GPU: {torch.cuda.get_device_name()}; target {pathlib.Path(args.target).name} ({args.load_format}), "
        f"{args.requests} requests of {args.new_tokens} new tokens at most, greedy",
        "",
        "| clients | config | tok/s | x plain as served | first tokens, ms: median / p90 |",
        "|---|---|---|---|---|",
    ]
    rows = [row for row in configs([int(n) for n in args.speculate_below.split(",")]) if row[1] is False or draft]
    warmed = False  # the process's kernels compiled for this workload's shapes
    with memd_process(*memd_args(args.target, draft, settings)) as memd:
        for n_clients in clients:
            plain = None
            for name, dflash, alone, below in rows:
                cfg = ModeldConfig(
                    device="cuda",
                    memd=memd,
                    target_model=args.target,
                    load_format=args.load_format,
                    draft_model=draft if dflash else None,
                    tuning=Tuning(alone_prompt_tokens=alone),
                    speculative_algorithm="dflash" if dflash else "none",
                    speculative_disable_by_batch_size=below,
                )
                with running_engine(cfg) as engine:
                    generate_all(engine, prompts[:2], 8, True, "warm")
                    if not warmed:
                        run_clients(engine, prompts, n_clients, args, ignore_eos, "warm-workload")
                        warmed = True
                    tokens, seconds, firsts = run_clients(
                        engine, prompts, n_clients, args, ignore_eos, name.replace(" ", "-")
                    )
                rate = tokens / seconds
                plain = plain or rate
                p90 = statistics.quantiles(firsts, n=10)[-1]
                lines.append(
                    f"| {n_clients} | {name} | {rate:.1f} | {rate / plain:.2f} | "
                    f"{statistics.median(firsts):.1f} / {p90:.1f} |"
                )
                print(lines[-1], flush=True)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
