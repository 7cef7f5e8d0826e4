"""Is a batch-1 decode step host-bound or device-bound? The engine's loop in this thread at batch 1 (CUDA graphs as
served), each engine step's host time split into its parts (scheduling, packing and the inputs' copy, the launch,
the rest: the wait for the tokens, commit and output), beside the device's span of the step's work (CUDA events
from the packing to the end of the forward) and the same graphs replayed back to back (the device's time for a step
when the host keeps up), with nothing between the launches and with what the engine does before one (the inputs'
copy, the wait on memd's table event, a synchronise), to find what makes the engine's launch cost more. The passes
that admit a request (its MatchPrefix, the prompt's prefill: its first tokens) are timed apart from decode steps.

    python -m bench.engine.step_span [--target DIR] [--load-format dummy] [--new-tokens 128] [--steps-per-replay 4]
        [--several-from N]

A step whose wall time is well above the back-to-back replay's is host-bound: the host's parts say where the
difference goes. One memd (a child process) serves the run; the prompts are chat prompts, EOS ignored.
"""

import argparse
import sys
import time

import torch

from bench.common.engine_hooks import PhaseTimer, SwitchableHooks
from bench.common.memd_process import memd_process
from bench.common.requests import prompts_for
from bench.engine.step_profile import run_in_this_thread
from modeld.config import ModeldConfig
from modeld.engine.build import build_engine
from modeld.engine.tuning import Tuning
from modeld.model.fetch_default import ensure_default_model

# The host parts of a step timed apart (modeld.engine.hooks' phases): planning (the scheduler's next step, an
# admission's MatchPrefix), packing the inputs and their copy, and the forward's launch.
PARTS = ("plan", "prepare", "forward")


KINDS = ("admission", "decode")  # the passes that admit a request (its MatchPrefix, the prompt's prefill), the others


class StepSpans(PhaseTimer):
    """Host seconds of each part per engine step, and a pair of CUDA events around each step's device work (from
    entering "prepare" to leaving the last "forward"), apart for the steps that admit a request and the others,
    while attached to the hooks the engine was built with. An admission counts every pass while the request waits
    (the first may only send its MatchPrefix); a decode pass that ran nothing is not a step, and its parts are not
    counted."""

    def __init__(self, engine, hooks: SwitchableHooks):
        super().__init__()
        self.hooks, self.scheduler = hooks, engine.scheduler
        self.host = {kind: dict.fromkeys(PARTS, 0.0) for kind in KINDS}
        self.wall, self.steps = dict.fromkeys(KINDS, 0.0), dict.fromkeys(KINDS, 0)
        self.events = {kind: [] for kind in KINDS}
        self.kind = "decode"
        self.pass_began: float | None = None  # when this pass's "plan" was entered (None: between passes, or unseen)
        self.last_left = 0.0  # when the pass's last phase was left: its end, for a pass that runs nothing
        self.ran, self.parts = False, dict.fromkeys(PARTS, 0.0)
        hooks.attach(self)

    def enter(self, phase: str) -> None:
        if phase == "plan":
            self._pass_ends()
            self.kind = "admission" if self.scheduler.waiting else "decode"
            self.ran, self.parts = False, dict.fromkeys(PARTS, 0.0)
            self.pass_began = time.perf_counter()
        elif phase == "run":
            self.ran = True
        elif phase == "prepare":
            self.events[self.kind].append([self._event(), None])
        super().enter(phase)

    def leave(self, phase: str) -> None:
        super().leave(phase)
        self.last_left = time.perf_counter()
        if phase == "forward" and self.events[self.kind]:
            self.events[self.kind][-1][1] = self._event()
        elif phase == "emit":
            self._pass_ends()

    def timed(self, phase: str, seconds: float) -> None:
        if phase in PARTS:
            self.parts[phase] += seconds

    def _pass_ends(self) -> None:
        """The pass under way is over (its last phase left): counted if it ran a step or admits a request."""
        if self.pass_began is None:
            return
        if self.ran or self.kind == "admission":
            self.wall[self.kind] += self.last_left - self.pass_began
            self.steps[self.kind] += self.ran
            for part, seconds in self.parts.items():
                self.host[self.kind][part] += seconds
        self.pass_began = None

    @staticmethod
    def _event() -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def close(self) -> dict[str, dict[str, float]]:
        """Detaches; per kind of step, milliseconds per engine step: wall, each host part, the rest, and the device
        span."""
        self.hooks.detach()
        torch.cuda.synchronize()
        rows = {}
        for kind in KINDS:
            n = max(self.steps[kind], 1)
            out = {
                "steps": self.steps[kind],
                "wall": 1e3 * self.wall[kind] / n,
                **{part: 1e3 * s / n for part, s in self.host[kind].items()},
            }
            out["rest"] = out["wall"] - sum(out[part] for part in PARTS)
            spans = [start.elapsed_time(end) for start, end in self.events[kind] if end is not None]
            out["device span"] = sum(spans) / max(len(spans), 1)
            rows[kind] = out
        return rows


def back_to_back(graphs, replay, repeats: int, before=None) -> tuple[float, float]:
    """Device milliseconds per replay over `repeats` replays launched back to back (padding inputs: they write no
    K/V), and the host's milliseconds per launch call; with `before`, called before each launch and not timed
    (a synchronise there leaves the GPU idle at every launch, as the engine's loop does)."""
    graphs._pad_inputs(1, 1)
    replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    host = 0.0
    start.record()
    for _ in range(repeats):
        if before is not None:
            before()
        begin = time.perf_counter()
        replay()
        host += time.perf_counter() - begin
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / repeats, 1e3 * host / repeats


def launch_conditions(runner) -> dict[str, object]:
    """What the engine does before a launch, one at a time and together: the packed inputs' copy from pinned
    memory, the wait on memd's table event (CUDA IPC), a synchronise (the GPU idle when the launch comes)."""
    graphs, stream = runner.graphs, torch.cuda.current_stream()
    graphs._pad_inputs(1, 1)
    host = graphs.static[:, :1].cpu().numpy()  # a padding request's inputs: the copied step writes no K/V

    def copy():
        graphs.load(host)

    def wait():
        stream.wait_event(runner.tables_written)

    def engine_like():
        torch.cuda.synchronize()
        wait()
        copy()

    conditions = {
        "nothing": None,
        "the inputs' copy": copy,
        "a synchronise": torch.cuda.synchronize,
        "the copy and a synchronise": lambda: (torch.cuda.synchronize(), copy()),
    }
    if runner.tables_written is not None:
        conditions.update(
            {
                "memd's event wait": wait,
                "the event wait and a synchronise": lambda: (torch.cuda.synchronize(), wait()),
                "all three (the engine's order)": engine_like,
            }
        )
    return conditions


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.engine.step_span", description=__doc__.splitlines()[0])
    p.add_argument("--target", help="default: the converted default model")
    p.add_argument("--load-format", choices=["auto", "dummy"], default="auto")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--steps-per-replay", type=int, default=4, help="modeld's")
    p.add_argument(
        "--several-from", type=int, help="the smallest batch that runs several steps a replay (default: modeld's)"
    )
    p.add_argument("--prompts", type=int, default=3, help="requests answered one at a time")
    p.add_argument(
        "--overlap-decode",
        action="store_true",
        help="modeld's: then the wall time per step is the "
        "measure (a step's launch and its device span fall in the step before)",
    )
    args = p.parse_args(argv)
    args.target = args.target or str(ensure_default_model())
    prompts = prompts_for(args.target, args.load_format, max(args.prompts, 2))
    with memd_process(
        "--device",
        "cuda",
        "--target-model",
        args.target,
        "--page-size",
        "16",
        "--max-running-requests",
        "2",
        "--max-total-tokens",
        "65536",
        "--kv-cache-dtype",
        "bfloat16",
        "--draft-model",
        "none",
    ) as memd:
        cfg = ModeldConfig(
            device="cuda",
            memd=memd,
            target_model=args.target,
            load_format=args.load_format,
            speculative_algorithm="none",
            tuning=Tuning(steps_per_replay=args.steps_per_replay, overlap_decode=args.overlap_decode),
        )
        hooks = SwitchableHooks()  # StepSpans observes the runs after the warm-up through them
        built = build_engine(cfg, lambda serving: None, hooks=hooks)
        engine, graphs = built.engine, built.engine.runner.graphs
        if args.several_from is not None:
            graphs.several_from = args.several_from
        try:
            run_in_this_thread(engine, prompts[:2], 8, "warm")
            spans, tokens = StepSpans(engine, hooks), 0
            for i, prompt in enumerate(prompts[: args.prompts]):
                tokens += run_in_this_thread(engine, [prompt], args.new_tokens, f"span{i}")[1]
            rows = spans.close()
            replays = [(1, lambda: graphs.replay((1, 1)))] + [
                (k, lambda k=k: graphs.replay_decode_steps(1, k))
                for k in graphs.repeats
                if graphs.has_decode_steps(1, k)
            ]
            timed = [
                (name, k, *back_to_back(graphs, replay, 100, before))
                for name, before in launch_conditions(engine.runner).items()
                for k, replay in replays
            ]
        finally:
            engine.runner.ahead.drop()  # a step queued after the last request's end (--overlap-decode)
            engine.scheduler.memd.flush_releases()
            built.link.close()
    gpu = torch.cuda.get_device_name()
    print(
        f"GPU: {gpu}; batch 1, {args.prompts} requests of {args.new_tokens} tokens one at a time, {tokens} tokens "
        f"in {sum(spans.steps.values())} engine steps (several-from {graphs.several_from}"
        f"{', decode overlapped' if args.overlap_decode else ''})\n"
    )
    print(
        "| ms per engine step (admission: per request, its passes) | steps | wall | plan (admission: its "
        "MatchPrefix) | packing + copy | forward: the launch (admission: the prefill's forward) "
        "| rest (wait, commit, output) "
        "| device span |\n|---|---|---|---|---|---|---|---|"
    )
    for kind, row in rows.items():
        # overlapped decode steps: the queued steps' events overlap, their span is not one step's
        span = "-" if args.overlap_decode and kind == "decode" else f"{row['device span']:.3f}"
        print(
            f"| {kind} steps | {row['steps']} | {row['wall']:.3f} | {row['plan']:.3f} | {row['prepare']:.3f} "
            f"| {row['forward']:.3f} | {row['rest']:.3f} | {span} |"
        )
    print()
    print(
        "| graph replayed back to back, before each launch | decode steps a replay | device ms per decode step "
        "| host ms per launch call |\n|---|---|---|---|"
    )
    for name, k, ms, host in timed:
        print(f"| {name} | {k} | {ms / k:.3f} | {host:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
