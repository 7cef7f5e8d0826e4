"""memd's MatchPrefix handler work in process, no gRPC: an admission (a prompt matched and granted)
and its release (finished into the prefix cache), memd's CPU (shared memory) and CUDA backends side by side, the
GPU idle and busy. Splits a call into memd's Python (the slot manager) and the table publication
(`buffers.sync`), and prints the slowest functions of the CUDA backend's calls (cProfile). What it answers: where
the gap lies between a MatchPrefix handler's 0.11 ms in process on a CPU and 0.40 ms in the live memd on the GPU
machine (BENCHMARKS.md, memd: round trip, handler, publication, eviction).

    python -m bench.memd_handler [--calls 300] [--prompt-tokens 100]

Without a GPU: the CPU backend only. Prints milliseconds, median and 90th percentile.
"""

import argparse
import cProfile
import io
import pstats
import time

import torch

from bench.memd_latency import gpu_load, quantiles
from memd.config import config_from_args
from memd.plan import make_plan
from memd.pools import build_pools
from memd.server import make_buffers
from memd.slots import Release


def admissions(mgr, buffers, calls: int, prompt: int, profile: cProfile.Profile | None = None) -> dict[str, list]:
    """`calls` admissions and releases, each distinct (no prefix hit): ms of the match, of its sync, of the release."""
    times = {"match": [], "match sync": [], "release": [], "release sync": []}
    for i in range(calls):
        tokens = [(i * 7919 + j) % 30000 + 1 for j in range(prompt)]
        rid = f"r{i}"
        if profile:
            profile.enable()
        t0 = time.perf_counter()
        mgr.match_prefix("s", rid, tokens, extend_to=prompt)
        t1 = time.perf_counter()
        buffers.sync()
        t2 = time.perf_counter()
        mgr.apply_release("s", Release(commits=((rid, prompt),), finishes=(rid,), inserts=((rid, tuple(tokens)),)))
        t3 = time.perf_counter()
        buffers.sync()
        t4 = time.perf_counter()
        if profile:
            profile.disable()
        for name, start, end in (
            ("match", t0, t1),
            ("match sync", t1, t2),
            ("release", t2, t3),
            ("release sync", t3, t4),
        ):
            times[name].append((end - start) * 1e3)
    mgr.flush_cache()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--prompt-tokens", type=int, default=100)
    args = parser.parse_args()
    devices = ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]
    print("| backend | GPU | match | match sync | release | release sync |\n|---|---|---|---|---|---|")
    profile = cProfile.Profile()
    for device in devices:
        cfg = config_from_args(["--device", device, "--max-total-tokens", "65536", "--draft-model", "default"])
        buffers = make_buffers(cfg, epoch=1)
        try:
            mgr, _ = build_pools(make_plan(cfg), buffers, 1)
            mgr.open_session("s", model="m")
            admissions(mgr, buffers, 30, args.prompt_tokens)  # warm: CuPy's kernels loaded, its pools filled
            for busy in (False, True) if device == "cuda" else (False,):
                with gpu_load(busy):
                    times = admissions(
                        mgr, buffers, args.calls, args.prompt_tokens, profile if device == "cuda" and busy else None
                    )
                cells = " | ".join(quantiles(times[k]) for k in times)
                print(f"| {buffers.backend} | {'busy' if busy else 'idle'} | {cells} |")
        finally:
            buffers.close()
    if len(devices) > 1:
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(15)
        print("\nCUDA backend, GPU busy: the slowest functions by own time\n\n```\n" + out.getvalue().strip() + "\n```")


if __name__ == "__main__":
    main()
