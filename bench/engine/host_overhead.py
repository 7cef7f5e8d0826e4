"""The engine thread's host work per step at high concurrency, apart from the model: scheduling, memd calls, input
packing, committing the step's tokens and output processing. On the CPU with a model so small that its forward is
cheap (bench/configs/tiny-host, dummy weights), the engine as served otherwise (memd a child process, decode
lookahead 32, calls sent ahead); the model's forward, its logits and sampling are timed apart and taken out, so
what is left is the Python a GPU step waits on too (on the GPU, where a decode step of the 135M model at 256
requests computes in about a millisecond, it is most of the step).

    python -m bench.engine.host_overhead [--concurrency 64,256] [--new-tokens 64] [--prompt-tokens 32] [--rounds 3]

Every request answers --new-tokens greedy tokens (ignore_eos) to random prompt ids, all submitted at once, while
this process's main thread reads every request's stream as gRPC handlers do. Prints, per concurrency, the median
over rounds of: steps, wall ms per step, model ms per step (forward, logits, sampling), host ms per step, host
microseconds per request-step, and the memd calls the engine sent (waited for or not).
"""

import argparse
import statistics
import sys
import time

import modeld.engine.loop
from bench.common.in_process import Patches, running_engine
from bench.common.memd_process import memd_process
from bench.common.requests import generate_all
from bench.common.tiny_host import TINY, many_requests_memd_flags, random_prompts
from modeld.config import ModeldConfig


class ModelTime:
    """Wall time inside the model (forward, logits, sampling) and of whole busy steps, with the items they ran and the
    memd calls the engine sent."""

    def __init__(self, engine):
        self.model = self.steps_time = 0.0
        self.steps = self.items = self.memd_calls = 0
        self.patches = Patches()
        runner = engine.runner
        for owner, name in ((runner, "forward"), (runner.model, "logits"), (modeld.engine.loop, "sample")):
            self.patches.replace(owner, name, self._timed)
        for name in ("alloc", "alloc_async", "free", "match_prefix", "match_prefix_batch"):
            self.patches.replace(engine.scheduler.memd.session, name, self._counted)

        def timed_step(step):
            def timed():
                begin = time.perf_counter()
                busy = step()
                if busy:
                    self.steps += 1
                    self.steps_time += time.perf_counter() - begin
                return busy

            return timed

        def counted_prepare(prepare):
            def counted(items, *a):
                self.items += len(items)
                return prepare(items, *a)

            return counted

        self.patches.replace(engine, "_step", timed_step)
        self.patches.replace(runner, "prepare", counted_prepare)

    def _timed(self, fn):
        def timed(*a, **kw):
            begin = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.model += time.perf_counter() - begin

        return timed

    def _counted(self, fn):
        def counted(*a, **kw):
            self.memd_calls += 1
            return fn(*a, **kw)

        return counted

    def close(self) -> tuple[int, float, float, float, float, int]:
        """(steps, wall ms / step, model ms / step, host ms / step, host us / request-step, memd calls sent)."""
        self.patches.undo()
        n = max(1, self.steps)
        host = self.steps_time - self.model
        return (
            self.steps,
            1e3 * self.steps_time / n,
            1e3 * self.model / n,
            1e3 * host / n,
            1e6 * host / max(1, self.items),
            self.memd_calls,
        )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.engine.host_overhead", description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", default="64,256")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",")]
    prompts = random_prompts(max(levels), args.prompt_tokens)
    print(
        f"engine thread on the CPU, {TINY.name} (dummy weights), {args.prompt_tokens} prompt + {args.new_tokens} new "
        f"tokens a request, greedy, median of {args.rounds} rounds\n\n| requests | steps | wall ms / step | "
        "model ms / step | host ms / step | host us / request-step | memd calls |\n|---|---|---|---|---|---|---|"
    )
    with memd_process("--device", "cpu", "--target-model", str(TINY), *many_requests_memd_flags(max(levels))) as memd:
        cfg = ModeldConfig(
            device="cpu",
            memd=memd,
            target_model=str(TINY),
            load_format="dummy",
            speculative_algorithm="none",
        )
        with running_engine(cfg) as engine:
            generate_all(engine, prompts[:8], 8, True, "warm")
            for level in levels:
                rows = []
                for k in range(args.rounds):
                    timing = ModelTime(engine)
                    generate_all(engine, prompts[:level], args.new_tokens, True, f"c{level}-{k}")
                    rows.append(timing.close())
                steps, *per_step, calls = (statistics.median(col) for col in zip(*rows))
                print(
                    f"| {level} | {steps:.0f} | "
                    + " | ".join(f"{v:.2f}" for v in per_step[:3])
                    + f" | {per_step[3]:.1f} "
                    f"| {calls:.0f} |"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
