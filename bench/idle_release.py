"""A request's first tokens at batch 1 when the engine was idle before it: the releases of the idle pass that ran
after the last request sent ahead without waiting (modeld's way: the arrival's MatchPrefix follows them on memd's
call stream) against waited for (flush_releases, as before), in interleaved rounds of one run.

    python -m bench.idle_release [--device cpu|cuda] [--requests 20] [--rounds 6] [--new-tokens 16]

One request at a time, each submitted as soon as the one before completed (a client's next request), as the engine
runs it in its own thread. On the CPU the target is bench/configs/tiny-host with dummy weights (its forward is cheap,
so memd's round trips show); with --device cuda, the default model. Prints the median over rounds of the mean first
tokens' latency and of the request's whole time.
"""

import argparse
import statistics
import sys
import time

from bench.engine_speed import generate_all, prompts_for
from bench.host_overhead import TINY, many_requests_memd_flags, random_prompts
from bench.in_process import Patches, running_engine
from bench.memd_process import memd_process
from modeld.config import ModeldConfig
from modeld.fetch_default import ensure_default_model

MODES = ("waited (before)", "sent ahead")


def one_round(engine, prompts, mode: str, tag: str, new_tokens: int) -> tuple[float, float]:
    """(mean first tokens' ms, mean request ms) of the prompts answered one at a time."""
    patches = Patches()
    if mode == MODES[0]:
        patches.replace(engine.scheduler.memd, "release_idle", lambda sent_ahead: engine.scheduler.memd.flush_releases)
    firsts = []
    begin = time.perf_counter()
    try:
        for i, prompt in enumerate(prompts):
            generate_all(engine, [prompt], new_tokens, True, f"{tag}-{i}", first_tokens=firsts)
    finally:
        patches.undo()
    return 1e3 * statistics.mean(t for t, _ in firsts), 1e3 * (time.perf_counter() - begin) / len(prompts)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.idle_release", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--requests", type=int, default=20, help="requests a round, one at a time")
    p.add_argument("--rounds", type=int, default=6, help="rounds per mode, the modes interleaved")
    p.add_argument("--new-tokens", type=int, default=16)
    args = p.parse_args(argv)
    if args.device == "cpu":
        target, load_format, prompts = str(TINY), "dummy", random_prompts(args.requests, 32)
    else:
        target, load_format = str(ensure_default_model()), "auto"
        prompts = prompts_for(target, "auto", args.requests)
    results = {mode: [] for mode in MODES}
    with memd_process("--device", args.device, "--target-model", target, *many_requests_memd_flags(4)) as memd:
        cfg = ModeldConfig(
            device=args.device, memd=memd, target_model=target, load_format=load_format, speculative_algorithm="none"
        )
        with running_engine(cfg) as engine:
            generate_all(engine, prompts[:2], 8, True, "warm")
            for k in range(args.rounds):
                for mode in MODES:
                    results[mode].append(one_round(engine, prompts, mode, f"{k}-{mode[:4]}", args.new_tokens))
    print(
        f"{args.device}, {target.rsplit('/', 1)[-1]} ({load_format}), {args.requests} requests of {args.new_tokens} "
        f"tokens one at a time, median of {args.rounds} rounds\n\n| idle pass's releases | first tokens, ms | "
        "request, ms | x first tokens |\n|---|---|---|---|"
    )
    before = statistics.median(r[0] for r in results[MODES[0]])
    for mode, rows in results.items():
        first = statistics.median(r[0] for r in rows)
        print(f"| {mode} | {first:.2f} | {statistics.median(r[1] for r in rows):.2f} | {before / first:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
