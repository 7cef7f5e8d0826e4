"""modeld's engine at the concurrency of training-data generation (hundreds of requests in flight): tokens/s
in this process (no gRPC), steps per second, and where the engine thread's host time goes (cProfile of its
steps), so that the gap to the same requests through gRPC (train.generate, BENCHMARKS.md) can be placed.

    python -m bench.high_concurrency [--target DIR] [--load-format dummy] [--concurrency 384] [--new-tokens 256]
        [--prompt-tokens 96] [--top 25]

One memd child process on the GPU; modeld's engine with CUDA graphs and a decode lookahead, as modeld serves.
Prompts are random token ids, answers run to --new-tokens (ignore_eos), so every request decodes as long as
the others: the steady state of a large batch, plus one prefill wave.
"""

import argparse
import cProfile
import io
import pathlib
import pstats
import sys
import time

import torch

from bench.engine_speed import generate_all
from bench.in_process import running_engine
from bench.memd_process import memd_process
from modeld.config import ModeldConfig

SMOLLM2_SHAPE = pathlib.Path(__file__).parent / "configs" / "smollm2-135m"


def profiled_steps(engine) -> tuple[cProfile.Profile, list[float]]:
    """Profiles every step the engine thread takes from now on; also records each busy step's wall time."""
    prof, times, step = cProfile.Profile(), [], engine._step

    def timed_step():
        begin = time.perf_counter()
        prof.enable()
        try:
            busy = step()
        finally:
            prof.disable()
        if busy:
            times.append(time.perf_counter() - begin)
        return busy

    engine._step = timed_step
    return prof, times


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.high_concurrency", description=__doc__.splitlines()[0])
    p.add_argument("--target", default=str(SMOLLM2_SHAPE), help="HF folder (default: the 135M shape, dummy weights)")
    p.add_argument("--load-format", choices=["auto", "dummy"], default="dummy")
    p.add_argument("--concurrency", type=int, default=384)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--prompt-tokens", type=int, default=96)
    p.add_argument("--page", type=int, default=64)
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args(argv)
    memd_flags = [
        "--device",
        "cuda",
        "--target-model",
        args.target,
        "--page-size",
        str(args.page),
        "--max-running-requests",
        str(args.concurrency),
        "--mem-fraction",
        "0.3",
        "--kv-cache-dtype",
        "bfloat16",
        "--draft-model",
        "none",
        "--chunked-prefill-size",
        "8192",
    ]
    gen = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(100, 40000, (args.prompt_tokens,), generator=gen).tolist() for _ in range(args.concurrency)
    ]
    with memd_process(*memd_flags) as memd:
        cfg = ModeldConfig(
            device="cuda",
            memd=memd,
            target_model=args.target,
            load_format=args.load_format,
        )
        with running_engine(cfg) as engine:
            generate_all(engine, prompts[:8], 8, True, "warm")
            tokens, seconds, _ = generate_all(engine, prompts, args.new_tokens, True, "plain")
            prof, times = profiled_steps(engine)
            ptokens, pseconds, _ = generate_all(engine, prompts, args.new_tokens, True, "profiled")
    print(
        f"GPU: {torch.cuda.get_device_name()}; target {pathlib.Path(args.target).name} ({args.load_format}); "
        f"{args.concurrency} requests x {args.prompt_tokens} prompt + {args.new_tokens} new tokens, greedy, page "
        f"{args.page}"
    )
    print(f"\nin-process engine: {tokens / seconds:.0f} tokens/s ({tokens} tokens in {seconds:.2f} s)")
    print(
        f"profiled run: {ptokens / pseconds:.0f} tokens/s, {len(times)} steps, mean step "
        f"{1000 * sum(times) / len(times):.2f} ms, "
        f"median {1000 * sorted(times)[len(times) // 2]:.2f} ms"
    )
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(args.top)
    print("\nengine thread, by own time:\n" + out.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
