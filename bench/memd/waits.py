"""Which memd calls modeld's engine waits for, by kind, per 100 decode steps: at batch 1 and at 16 concurrent, with
the engine as served (calls sent ahead; plain decoding, or DFLASH with --draft). The counts are the scheduler's
logic and so the same on any machine; the times are this machine's (on the CPU they say what each kind costs
relative to the others, not a share of a GPU step). Runs on the CPU (memd's shared-memory backend) or, with
--device cuda, on the GPU.

    python -m bench.memd.waits [--device cpu] [--new-tokens 64] [--batch1 3] [--concurrency 16] [--draft DIR]
        [--switch-interval S]

Kinds: "MatchPrefix" (a lone arrival's match, with its first chunk's grant), "MatchPrefixBatch" (a burst of
arrivals registered in one call), "Alloc" (a call the step waited for: admissions, prefill chunks, decodes short of
slots, releases when nothing else carries them), "Alloc sent ahead, awaited" (a call sent without waiting whose
answer was not there when a step needed it; also an idle pass's releases, sent ahead, when the next pass waits
for them), "Free" (releases waited for: running requests that got no step give back their spare slots).

Beside each kind, memd's own time for a call of its method (its handler, from memd's `memd:rpc_duration_seconds`
over every call of the run, waited or not): what the engine waits beyond it is the transport and the two processes'
threads.
"""

import argparse
import collections
import pathlib
import statistics
import sys

from bench.common.engine_hooks import PhaseTimer, SwitchableHooks, device_steps
from bench.common.in_process import running_engine
from bench.common.memd_process import memd_process
from bench.common.metrics_scrape import metric_samples
from bench.common.requests import generate_all, prompts_for
from memd import defaults
from modeld.config import ModeldConfig
from modeld.model.fetch_default import ensure_default_model

# The engine's memd phases (modeld.engine.hooks) the engine waits in, by the kind this table names them ("memd send",
# the sending alone of a call sent ahead, is no wait; "memd answer" is entered only when its answer has not come).
KINDS = {
    "memd alloc": "Alloc",
    "memd free": "Free",
    "memd match": "MatchPrefix",
    "memd match batch": "MatchPrefixBatch",
    "memd answer": "Alloc sent ahead, awaited",
}


class Waits(PhaseTimer):
    """Counts and times the memd calls an engine waits for, by kind, and its decode steps (a replay of k steps
    counts k, as bench.engine.speed's breakdown does), while attached to the hooks the engine was built with."""

    def __init__(self, hooks: SwitchableHooks):
        super().__init__()
        self.hooks = hooks
        self.times = collections.defaultdict(list)  # kind -> seconds of each call
        self.steps = 0
        hooks.attach(self)

    def timed(self, phase: str, seconds: float) -> None:
        if phase in KINDS:
            self.times[KINDS[phase]].append(seconds)

    def committed(self, results) -> None:
        self.steps += device_steps(results)

    def close(self, handler_ms: dict[str, float]) -> list[str]:
        """Detaches; the table rows: kind, calls and milliseconds per 100 decode steps, the milliseconds
        a waited call took (mean, median and the slowest: does one call carry the mean?), and memd's handler time
        for a call of its method (handler_ms, by method)."""
        self.hooks.detach()
        per = 100 / max(1, self.steps)
        rows = []
        for kind, times in sorted(self.times.items()):
            method = "Alloc" if kind.startswith("Alloc") else kind
            handler = f"{handler_ms[method]:.3f}" if method in handler_ms else "-"
            ms = [1e3 * t for t in times]
            rows.append(
                f"{kind} | {len(ms) * per:.1f} | {sum(ms) * per:.2f} | {sum(ms) / len(ms):.3f} / "
                f"{statistics.median(ms):.3f} / {max(ms):.3f} | {handler}"
            )
        return rows


class HandlerTimes:
    """memd's own time per call, by method, between two reads of its metrics (memd started with --metrics-port)."""

    def __init__(self, memd_address: str):
        self.log = pathlib.Path(memd_address.removeprefix("unix://")).parent / "memd.log"  # bench.common.memd_process's
        self.start = self._read()

    def _read(self) -> dict[str, tuple[float, float]]:
        """method -> (seconds, calls) so far."""
        totals = collections.defaultdict(lambda: [0.0, 0.0])
        for sample in metric_samples(self.log.read_text(), "memd"):
            if sample.name == "memd:rpc_duration_seconds_sum":
                totals[sample.labels["method"]][0] += sample.value
            elif sample.name == "memd:rpc_duration_seconds_count":
                totals[sample.labels["method"]][1] += sample.value
        return {method: (s, n) for method, (s, n) in totals.items()}

    def since_start(self) -> dict[str, float]:
        """Milliseconds a call, by method, over the calls since this object was made."""
        now, out = self._read(), {}
        for method, (seconds, calls) in now.items():
            s0, n0 = self.start.get(method, (0.0, 0.0))
            if calls > n0:
                out[method] = 1000 * (seconds - s0) / (calls - n0)
        return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.memd.waits", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--target", help="HF folder (default: the project's SmolLM2-135M-Instruct)")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--batch1", type=int, default=3, help="prompts answered one at a time")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument(
        "--draft", help="a DFLASH draft (modeld/default_draft: the shipped one): the engine as served with it"
    )
    p.add_argument(
        "--switch-interval",
        type=float,
        help="Python's GIL switch interval in seconds for this process, the engine's (default: Python's)",
    )
    args = p.parse_args(argv)
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    target = args.target or str(ensure_default_model())
    prompts = prompts_for(target, "auto", max(args.batch1, args.concurrency))
    memd_flags = [
        "--device",
        args.device,
        "--target-model",
        target,
        "--max-running-requests",
        str(args.concurrency),
        "--max-total-tokens",
        "65536",
        "--metrics-port",
        "0",
        "--draft-model",
        args.draft or "none",
    ]
    if args.draft:  # the bounded draft pool memd sizes by default for the shipped draft
        memd_flags += [
            "--draft-kv-ratio",
            str(defaults.DEFAULT_DRAFT_KV_RATIO),
            "--draft-window",
            str(defaults.default_draft_window()),
        ]
    print(
        f"engine as served ({'DFLASH' if args.draft else 'plain'}, calls sent ahead), {args.new_tokens} new tokens "
        f"at most, greedy, device {args.device}\n\n| batch | kind | waited calls / 100 steps | ms waited / 100 steps "
        f"| ms a waited call: mean / p50 / max | memd's handler, ms a call |\n|---|---|---|---|---|---|"
    )
    with memd_process(*memd_flags) as memd:
        cfg = ModeldConfig(
            device=args.device,
            memd=memd,
            target_model=target,
            draft_model=args.draft,
            speculative_algorithm="dflash" if args.draft else "none",
        )
        hooks = SwitchableHooks()
        with running_engine(cfg, hooks) as engine:
            generate_all(engine, prompts[:2], 8, False, "warm")
            for batch, groups in (
                (1, [[q] for q in prompts[: args.batch1]]),
                (args.concurrency, [prompts[: args.concurrency]]),
            ):
                waits, handlers = Waits(hooks), HandlerTimes(memd)
                for k, group in enumerate(groups):
                    generate_all(engine, group, args.new_tokens, False, f"b{batch}-{k}")
                for row in waits.close(handlers.since_start()):
                    print(f"| {batch} | {row} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
