"""Clients that each send their next request when their last one completed, so that arrivals come one at a time
while the others decode (as users' do; bench.engine_speed's concurrent runs send a batch at once and wait for all of
it): tokens/s and first tokens, modeld's engine as served against --alone-prompt-tokens 128 (a lone arrival's prompt
chunk in a step of its own, replaying a graph of one request, instead of an eager step of the whole batch), plain
and DFLASH, in one run.

    python -m bench.clients [--target DIR] [--load-format dummy] [--draft DIR|none] [--clients 16]
        [--requests 64] [--new-tokens 128] [--ignore-eos]

One memd child process on the GPU serves every configuration in turn; each runs a warm-up first.
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
from modeld.config import PROMPT_TOKENS, ModeldConfig
from modeld.fetch_default import ensure_default_model

CONFIGS = [("plain as served", False, 0), ("plain, a lone prompt chunk alone", False, max(PROMPT_TOKENS)),
           ("DFLASH as served", True, 0), ("DFLASH, a lone prompt chunk alone", True, max(PROMPT_TOKENS))]


def run_clients(engine, prompts: list[list[int]], args, ignore_eos: bool, tag: str) -> tuple[int, float, list[float]]:
    """`args.clients` threads share `args.requests` requests, each sending its next when its last completed:
    (generated tokens, seconds, each request's first tokens in ms)."""
    work = [prompts[i % len(prompts)] for i in range(args.requests)]
    firsts: list[tuple[float, int]] = []

    def client(c: int) -> int:
        return sum(generate_all(engine, [work[i]], args.new_tokens, ignore_eos, f"{tag}-{i}", first_tokens=firsts)[0]
                   for i in range(c, len(work), args.clients))

    begin = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
        tokens = sum(pool.map(client, range(args.clients)))
    return tokens, time.perf_counter() - begin, [1000 * t for t, _ in firsts]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.clients", description=__doc__.splitlines()[0])
    add_model_arguments(p)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--ignore-eos", action="store_true", help="every request decodes --new-tokens")
    args = p.parse_args(argv)
    args.target = args.target or str(ensure_default_model())
    draft = None if args.draft == "none" else args.draft
    ignore_eos = args.load_format == "dummy" or args.ignore_eos
    prompts = prompts_for(args.target, args.load_format, args.requests)
    settings = argparse.Namespace(page=16, concurrency=[args.clients], ratio=0.25, window=256)
    lines = [f"GPU: {torch.cuda.get_device_name()}; target {pathlib.Path(args.target).name} ({args.load_format}), "
             f"{args.clients} clients, {args.requests} requests of {args.new_tokens} new tokens at most, greedy", "",
             "| config | tok/s | x as served | first tokens, ms: median / p90 |", "|---|---|---|---|"]
    served = {}
    with memd_process(*memd_args(args.target, draft, settings)) as memd:
        for name, dflash, alone in CONFIGS:
            if dflash and draft is None:
                continue
            cfg = ModeldConfig(device="cuda", memd=memd, target_model=args.target, load_format=args.load_format,
                               draft_model=draft if dflash else None,
                               speculative_algorithm="dflash" if dflash else "none", alone_prompt_tokens=alone)
            with running_engine(cfg) as engine:
                generate_all(engine, prompts[:2], 8, True, "warm")
                tokens, seconds, firsts = run_clients(engine, prompts, args, ignore_eos, name.replace(" ", "-"))
            rate = tokens / seconds
            served.setdefault(dflash, rate)
            p90 = statistics.quantiles(firsts, n=10)[-1]
            lines.append(f"| {name} | {rate:.1f} | {rate / served[dflash]:.2f} | {statistics.median(firsts):.1f} / "
                         f"{p90:.1f} |")
            print(lines[-1], flush=True)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
