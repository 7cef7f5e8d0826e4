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

from bench.common.engine_hooks import PhaseTimer, SwitchableHooks
from bench.common.in_process import running_engine
from bench.common.memd_process import memd_process
from bench.common.requests import generate_all
from bench.common.tiny_host import TINY, many_requests_memd_flags, random_prompts
from modeld.config import ModeldConfig

# The model's phases (modeld.engine.hooks): the draft, the forward (a decode chain's sampling inside it), sampling.
MODEL_PHASES = ("draft", "forward", "sample")


class ModelTime(PhaseTimer):
    """Wall time inside the model (draft, forward, sampling) and of whole passes that ran a step, with the items they
    committed and the memd calls the engine sent (waited for or sent ahead), while attached to the hooks the engine
    was built with."""

    def __init__(self, hooks: SwitchableHooks):
        super().__init__()
        self.hooks = hooks
        self.model = self.steps_time = 0.0
        self.steps = self.items = self.memd_calls = 0
        self.pass_began: float | None = None  # when this pass's "plan" was entered (None: not seen)
        hooks.attach(self)

    def enter(self, phase: str) -> None:
        if phase == "plan":
            self.pass_began = time.perf_counter()
        elif phase.startswith("memd ") and phase != "memd answer":  # a call made (the wait for an answer is none)
            self.memd_calls += 1
        super().enter(phase)

    def leave(self, phase: str) -> None:
        super().leave(phase)
        if phase == "emit" and self.pass_began is not None:  # a pass that ran a step ends
            self.steps += 1
            self.steps_time += time.perf_counter() - self.pass_began
            self.pass_began = None

    def timed(self, phase: str, seconds: float) -> None:
        if phase in MODEL_PHASES:
            self.model += seconds

    def committed(self, results) -> None:
        self.items += len(results)

    def close(self) -> tuple[int, float, float, float, float, int]:
        """Detaches; (steps, wall ms / step, model ms / step, host ms / step, host us / request-step, memd calls
        sent)."""
        self.hooks.detach()
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
        hooks = SwitchableHooks()
        with running_engine(cfg, hooks) as engine:
            generate_all(engine, prompts[:8], 8, True, "warm")
            for level in levels:
                rows = []
                for k in range(args.rounds):
                    timing = ModelTime(hooks)
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
