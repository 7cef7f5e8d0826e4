"""What a full garbage collection costs the engine's process, its heap frozen (modeld.heap_freeze, as the engine
process runs) against not: the engine built on the default model and warmed up, then the time of a full
collection (`gc.collect()`, what Python starts on its own now and then, on whichever thread allocates: the engine
thread in the middle of a step, say) and the objects it walks, each way in one run.

    python -m bench.gc_pause [--device cpu|cuda] [--repeats 5]
"""

import argparse
import gc
import statistics
import sys
import time

from bench.engine_speed import generate_all, prompts_for
from bench.host_overhead import many_requests_memd_flags
from bench.in_process import running_engine
from bench.memd_process import memd_process
from modeld.config import ModeldConfig
from modeld.fetch_default import ensure_default_model
from modeld.heap_freeze import freeze_heap


def full_collection_ms(repeats: int) -> float:
    """The median time of a full collection."""
    times = []
    for _ in range(repeats):
        begin = time.perf_counter()
        gc.collect()
        times.append(time.perf_counter() - begin)
    return 1e3 * statistics.median(times)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gc_pause", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    target = str(ensure_default_model())
    prompts = prompts_for(target, "auto", 2)
    with memd_process("--device", args.device, "--target-model", target, *many_requests_memd_flags(4)) as memd:
        cfg = ModeldConfig(device=args.device, memd=memd, target_model=target, speculative_algorithm="none")
        with running_engine(cfg) as engine:
            generate_all(engine, prompts, 8, True, "warm")
            walked, thawed = len(gc.get_objects()), full_collection_ms(args.repeats)
            freeze_heap("for the benchmark")
            try:
                left, frozen = len(gc.get_objects()), full_collection_ms(args.repeats)
            finally:
                gc.unfreeze()
    print(
        f"{args.device}, the default model's engine built and warmed up, median of {args.repeats} full collections"
        "\n\n| heap | objects a full collection walks | ms a full collection |\n|---|---|---|\n"
        f"| not frozen (before) | {walked} | {thawed:.2f} |\n| frozen (modeld's engine process) | {left} | "
        f"{frozen:.2f} |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
