"""What an admission costs memd's allocator once the prefix cache has filled the pool, as the cache grows: a long
running server's steady state, where every admission evicts. In-process (memd.slots on numpy tables, no gRPC, no
GPU), so only the allocator's own work is timed.

    python -m bench.memd.eviction [--nodes 1000,10000,100000] [--calls 400]

For each size, a pool of exactly that many cached prompts (each its own node of 3 pages: 48 tokens at page size 16),
a bounded draft pool at ratio 0.25 with a window of 256 as modeld's default draft has; then --calls admissions of a
new 40-token prompt granted to 72 tokens (MatchPrefix with extend_to, as modeld's lone arrival asks), each finished
with its 61 tokens cached (what a 21-token answer leaves). Every admission needs pages the cache holds, so it evicts.
Prints the median and 90th percentile of the admission and of the finish, in milliseconds.

The module imports only memd, so the same file measures another tree's allocator: run it by path with that tree
first on PYTHONPATH (BENCHMARKS.md shows the command)."""

import argparse
import random
import statistics
import time

import numpy as np

from memd.slots import DraftMode, Release, SlotManager

P, PROMPT, EXTEND_TO, ANSWER, WINDOW = 16, 40, 72, 21, 256


def filled_manager(nodes: int, rng: random.Random) -> SlotManager:
    """A manager whose target pool is all cache but for one admission's pages: `nodes` prompts of 3 pages."""
    pages = nodes * 3 + EXTEND_TO // P + 1
    ctx, rows = 4096, 8
    mgr = SlotManager(
        target_pages=pages,
        draft_pages=pages // 4,
        page_size=P,
        mode=DraftMode.BOUNDED,
        window=WINDOW,
        trim_gap=0,
        max_requests=rows,
        context_len=ctx,
        mapping=np.zeros((pages + 1) * P, np.int32),
        req_to_token=np.zeros((rows + 1, ctx), np.int32),
    )
    mgr.open_session("s", model="m")
    for i in range(nodes):
        admit_and_finish(mgr, f"fill{i}", rng)
    return mgr


def admit_and_finish(mgr: SlotManager, rid: str, rng: random.Random) -> tuple[float, float]:
    """One request of a new prompt: admitted with its grant, finished with its tokens cached; seconds of each."""
    tokens = [rng.randrange(1, 49152) for _ in range(PROMPT + ANSWER)]
    begin = time.perf_counter()
    mgr.match_prefix("s", rid, tokens[:PROMPT], extend_to=EXTEND_TO)
    admitted = time.perf_counter()
    mgr.apply_release("s", Release(commits=((rid, len(tokens)),), finishes=(rid,), inserts=((rid, tuple(tokens)),)))
    return admitted - begin, time.perf_counter() - admitted


def quantiles(values: list[float]) -> str:
    ms = sorted(v * 1e3 for v in values)
    return f"{statistics.median(ms):.3f} / {ms[int(0.9 * (len(ms) - 1))]:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", default="1000,10000,100000")
    parser.add_argument("--calls", type=int, default=400)
    args = parser.parse_args()
    print("| cached prompts (nodes) | admission (MatchPrefix + grant) p50 / p90 ms | finish p50 / p90 ms |")
    print("|---|---|---|")
    for nodes in (int(n) for n in args.nodes.split(",")):
        rng = random.Random(nodes)
        mgr = filled_manager(nodes, rng)
        times = [admit_and_finish(mgr, f"r{i}", rng) for i in range(args.calls)]
        print(f"| {nodes} | {quantiles([a for a, _ in times])} | {quantiles([f for _, f in times])} |", flush=True)


if __name__ == "__main__":
    main()
