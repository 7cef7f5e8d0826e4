"""Clients that each send their next request when their last one completed, so that arrivals come one at a time
while the others decode (as users' do; bench.engine.speed's concurrent runs send a batch at once and wait for all of
it): tokens/s and first tokens of modeld's engine as served, plain and DFLASH, against --ablate rows (by default: a
lone arrival's prompt chunk beside the decodes in an eager step of the whole batch instead of in a step of its own
replaying a graph of one request, alone_prompt_tokens=0; and DFLASH speculating only below 8 and below 4 running),
in one run, for each number of clients. Ratios are against plain as served with as many clients.

    python -m bench.serving.clients [--target DIR] [--load-format dummy] [--draft DIR|none] [--clients 4,8,16]
        [--requests 64] [--new-tokens 128] [--ignore-eos] [--rows plain,dflash] [--ablate [KIND:]KEY=VALUE,...]...

Each kind's rows run against a memd child process of their own on the GPU, with memd's defaults for that kind
(bench.common.served_memd). Each row runs a warm-up first, and the first row runs the whole workload once
unmeasured (on a fresh machine the first row otherwise paid Triton's compiles of the prompts' shapes: a p90 first
tokens of 748 ms).
"""

import argparse
import concurrent.futures
import pathlib
import statistics
import sys
import time

import torch

from bench.common.in_process import running_engine
from bench.common.requests import generate_all, prompts_for
from bench.common.rows import KINDS, add_model_arguments, add_row_arguments, row_config, rows_from_args
from bench.common.served_memd import MemdSettings, served_memd
from modeld.model.fetch_default import ensure_default_model

DEFAULT_ABLATIONS = (
    "alone_prompt_tokens=0",
    "adaptive_speculation=false",
)


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


def parse_args(argv=None) -> argparse.Namespace:
    """The command line, with args.rows the rows to run (bench.common.rows.Row)."""
    p = argparse.ArgumentParser(prog="python -m bench.serving.clients", description=__doc__.splitlines()[0])
    add_model_arguments(p)
    add_row_arguments(p, default_ablations=DEFAULT_ABLATIONS)
    p.add_argument("--clients", default="4,8,16", help="comma-separated numbers of clients, each a run")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--ignore-eos", action="store_true", help="every request decodes --new-tokens")
    args = p.parse_args(argv)
    args.rows = rows_from_args(p, args)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    args.target = args.target or str(ensure_default_model())
    draft = None if args.draft == "none" else args.draft
    ignore_eos = args.load_format == "dummy" or args.ignore_eos
    prompts = prompts_for(args.target, args.load_format, args.requests)
    clients = [int(n) for n in args.clients.split(",")]
    settings = MemdSettings(args.target, draft, max_running=max(clients))
    rates, firsts = {}, {}  # by (clients, row name)
    warmed = False  # the process's kernels compiled for this workload's shapes
    for kind in KINDS:
        mine = [row for row in args.rows if row.kind == kind]
        if not mine:
            continue
        with served_memd(kind, settings) as memd:
            for n_clients in clients:
                for row in mine:
                    with running_engine(row_config(row, memd, args.target, args.load_format, draft)) as engine:
                        generate_all(engine, prompts[:2], 8, True, "warm")
                        if not warmed:
                            run_clients(engine, prompts, n_clients, args, ignore_eos, "warm-workload")
                            warmed = True
                        tokens, seconds, ms = run_clients(
                            engine, prompts, n_clients, args, ignore_eos, row.name.replace(" ", "-")
                        )
                    rates[n_clients, row.name], firsts[n_clients, row.name] = tokens / seconds, ms
                    print(f"{n_clients} clients, {row.name}: {tokens / seconds:.1f} tok/s", flush=True)
    lines = [
        f"GPU: {torch.cuda.get_device_name()}; target {pathlib.Path(args.target).name} ({args.load_format}), "
        f"{args.requests} requests of {args.new_tokens} new tokens at most, greedy",
        "",
        "| clients | config | tok/s | x plain as served | first tokens, ms: median / p90 |",
        "|---|---|---|---|---|",
    ]
    for n_clients in clients:
        plain = rates.get((n_clients, "plain as served"))
        for row in args.rows:
            rate, ms = rates[n_clients, row.name], firsts[n_clients, row.name]
            ratio = "-" if plain is None else f"{rate / plain:.2f}"
            lines.append(
                f"| {n_clients} | {row.name} | {rate:.1f} | {ratio} | "
                f"{statistics.median(ms):.1f} / {statistics.quantiles(ms, n=10)[-1]:.1f} |"
            )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
