"""Fit a draft's training run into a time budget: time a few steps, then pick the anchors per sequence (and the
epochs) so that the planned schedule fills the budget, and train with the schedule paced by the clock
(train_draft.train(paced=True): warm-up and cosine over the seconds left, the epochs going on until they are
spent). A run stopped by the clock halfway through a step-based schedule ends at a high learning rate, and one
whose steps ran faster than the probe said ends early, leaving the rest of its call unused. Paced, the run ends
annealed when the budget does.

    python -m train.fit_budget --prompts DIR --responses DIR[,DIR] --out DRAFT --ckpt FILE --seconds S
        [--epochs 3] [--batch-anchors 8192] [--probe-anchors 512] [--layers 5] [--lr 6e-4] [--init DRAFT]
        [--batch-tokens 16384] [--log-json FILE] [--profile-steps N] [--schedule-seconds T --continue-args FILE]

One run may span several device calls (a call is at most 10 minutes; a session's GPU time is 30): with
--schedule-seconds T the anchors and epochs are planned for T seconds of training, this call trains its share
and leaves a checkpoint, and later calls on the same machine go on with the train.train_draft arguments it
prints (and writes to --continue-args) plus their own --time-budget; the schedule's clock is the checkpoint's,
so the run ends annealed when the T seconds are spent, or when a call without --schedule-seconds ends it.

The probes' steps are thrown away. A step's time depends on the anchors per sequence, so a second probe times the
setting the first picked, and the schedule is picked again from it. Epochs give way before anchors do: below
MIN_ANCHORS per sequence the schedule drops to fewer epochs at more anchors (a step at few anchors per sequence
spends its time on the target's forward, not on blocks). Each probe times its steps themselves (their end times),
not the whole call: set-up time varies by seconds, and timing whole calls overestimated a step by half.
"""

import argparse
import dataclasses
import pathlib
import sys
import time

import numpy as np

from train import batches
from train import train_draft as td

PROBE_WARMUP, PROBE_STEPS = 3, 20
PROBES = 2  # the first at --probe-anchors, the second at the anchors the first picked
SAVE_MARGIN_S = 25.0  # the checkpoint and the bf16 export at the end
PACKING_SLACK = 0.95  # batches are packed whole sequences: a step holds a little under --batch-anchors blocks
# The DFlash recipe anchors at least this many positions of a sequence (every position of a short answer): when the
# time allows fewer, the schedule takes fewer epochs rather than fewer anchors.
MIN_ANCHORS = 256


def valid_counts(seqs: list[dict], tc: td.TrainConfig) -> np.ndarray:
    return np.array([len(batches.anchor_positions(s, tc.max_len, tc.loop_repeats)) for s in seqs], dtype=np.int64)


def most_anchors(counts: np.ndarray, epochs: int, blocks: float) -> int:
    """The largest a (at least 1) with epochs * sum(min(a, count)) <= blocks."""
    lo, hi = 1, int(counts.max())
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if epochs * int(np.minimum(counts, mid).sum()) <= blocks:
            lo = mid
        else:
            hi = mid - 1
    return lo


def pick_schedule(counts: np.ndarray, epochs: int, blocks: float, min_anchors: int = MIN_ANCHORS) -> tuple[int, int]:
    """(anchors per sequence, epochs) whose schedule trains about `blocks` blocks: the most anchors that fit
    `epochs` epochs; when every position of every sequence fits, more epochs instead; when `epochs` would leave
    fewer than `min_anchors` per sequence, fewer epochs at more anchors (every sequence is still seen, and a
    step at few anchors per sequence spends its time on the target's forward, not on blocks)."""
    full = int(counts.sum())
    if full == 0:
        raise ValueError("no sequence has an anchor (no answers in the data)")
    if epochs * full <= blocks:
        return int(counts.max()), max(epochs, int(blocks // full))
    floor = min(min_anchors, int(counts.max()))
    for e in range(epochs, 1, -1):
        anchors = most_anchors(counts, e, blocks)
        if anchors >= floor:
            return anchors, e
    return most_anchors(counts, 1, blocks), 1


def base_config(args) -> td.TrainConfig:
    """The run's fixed settings (the anchors and the epochs are picked later)."""
    return td.TrainConfig(
        batch_anchors=args.batch_anchors,
        batch_tokens=args.batch_tokens,
        layers=args.layers,
        lr=args.lr,
        loop_repeats=args.loop_repeats,
        source_weights=args.source_weights,
    )


def step_seconds(target, seqs, tc: td.TrainConfig, device: str, log) -> float:
    """Wall seconds per training step at these settings: the mean of PROBE_STEPS steps after PROBE_WARMUP."""
    ends: list[float] = []
    td.train(
        target, seqs, tc, device, lambda _msg: None, max_steps=PROBE_WARMUP + PROBE_STEPS, save_every=0, step_ends=ends
    )
    if len(ends) <= PROBE_WARMUP:
        raise ValueError(f"the probe's schedule has only {len(ends)} steps: too little data to time a step")
    seconds = (ends[-1] - ends[PROBE_WARMUP - 1]) / (len(ends) - PROBE_WARMUP)
    log(f"probe: {seconds:.3f} s per step at {tc.anchors} anchors, {tc.batch_anchors} blocks per step")
    return seconds


PHASES = (
    "train.host_batch",
    "train.target",
    "train.draft_forward",
    "train.head_loss",
    "train.backward",
    "train.optimizer",
)  # the record_function ranges of a step (train_draft.train, train.block_loss)


def profile_steps(
    target, seqs, tc: td.TrainConfig, device: str, steps: int, log, rows: int = 15, trace: str | None = None
) -> str:
    """Where a step's time goes: after a warm-up call of PROBE_WARMUP steps (kernels compiled, memory cached), a
    call of `steps` steps under torch.profiler; the ops by their own device time (CPU time on the CPU), then by
    their own host time, the wall time against the device's busy time (host-bound or not), and each phase of a
    step by its host time. `trace`: also write the profile as a Chrome trace (gzip-compressed when it ends .gz)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = device.startswith("cuda")
    td.train(target, seqs, tc, device, lambda _msg: None, max_steps=PROBE_WARMUP, save_every=0)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    begin = time.monotonic()
    with profile(activities=activities) as prof:
        td.train(target, seqs, tc, device, lambda _msg: None, max_steps=steps, save_every=0)
        if cuda:
            torch.cuda.synchronize()
    wall = time.monotonic() - begin
    averages = prof.key_averages()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    busy = sum(getattr(e, key) for e in averages) / 1e6
    table = averages.table(sort_by=key, row_limit=rows)
    if cuda:
        table += "\n" + averages.table(sort_by="self_cpu_time_total", row_limit=rows)
    if trace:
        prof.export_chrome_trace(trace)
    phases = {e.key: e.cpu_time_total / 1e3 / steps for e in averages if e.key in PHASES}
    phase_line = ", ".join(f"{name.removeprefix('train.')} {phases[name]:.1f}" for name in PHASES if name in phases)
    log(
        f"profile of {steps} steps ({tc.anchors} anchors, {tc.batch_anchors} blocks per step): {wall:.2f} s wall, "
        f"{busy:.2f} s of {'device' if cuda else 'CPU'} op time (set-up of the call included); host ms a step by "
        f"phase: {phase_line}\n{table}"
    )
    return table


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m train.fit_budget", description=__doc__.splitlines()[0])
    p.add_argument("--prompts", required=True)
    p.add_argument("--responses", required=True, help="response shard folders, comma-separated")
    p.add_argument("--out", required=True)
    p.add_argument("--ckpt", required=True)
    p.add_argument("--seconds", type=float, required=True, help="the whole call's budget, probe and loading included")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-anchors", type=int, default=8192)
    p.add_argument("--probe-anchors", type=int, default=512)
    p.add_argument(
        "--layers",
        type=int,
        default=td.TrainConfig.layers,
        help="draft layers (4 continues the shipped draft with --init modeld/default_draft)",
    )
    p.add_argument("--lr", type=float, default=td.TrainConfig.lr, help="peak learning rate")
    p.add_argument(
        "--batch-tokens",
        type=int,
        default=td.TrainConfig.batch_tokens,
        help="sequence tokens a step at most (train_draft --batch-tokens)",
    )
    p.add_argument("--init", help="start from this saved draft's weights (train_draft --init)")
    p.add_argument(
        "--source-weights",
        default="",
        help="sharegpt=3,...: each answer to such a prompt counts this many times an epoch",
    )
    p.add_argument(
        "--loop-repeats",
        type=int,
        default=td.TrainConfig.loop_repeats,
        help="anchors stop this many periods into an answer's repetition loop (train.loops; 0: everywhere)",
    )
    p.add_argument("--target")
    p.add_argument("--device", default="cuda")
    p.add_argument("--log-json", help="write the settings, step time and per-step losses here")
    p.add_argument(
        "--schedule-seconds",
        type=float,
        help="training seconds of the whole run when later calls continue it (train_draft --resume "
        "--paced): the anchors and epochs are planned for them, and this call ends with a checkpoint "
        "part-way through the schedule (default: this call alone, ending annealed)",
    )
    p.add_argument(
        "--continue-args",
        help="write the train_draft arguments a later call continues with here (add --time-budget SECONDS)",
    )
    p.add_argument(
        "--profile-steps",
        type=int,
        default=0,
        help="first profile this many steps at the probe's settings (torch.profiler table in the log)",
    )
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    begin = time.monotonic()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = args.target  # None: the converted default model (later calls find it the same way)
    if folder is None:
        from modeld.model.fetch_default import ensure_default_model

        folder = str(ensure_default_model())
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    tokenizer = AutoTokenizer.from_pretrained(folder)
    seqs = batches.load_sequences(
        pathlib.Path(args.prompts), [pathlib.Path(d) for d in args.responses.split(",")], tokenizer, log
    )
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    target = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(args.device).eval().requires_grad_(False)
    base = base_config(args)
    counts = valid_counts(batches.weighted(seqs, base.weights()), base)  # train() weighs the sequences the same way
    anchors = args.probe_anchors
    if args.profile_steps:
        profile_steps(
            target, seqs, dataclasses.replace(base, anchors=anchors, epochs=1), args.device, args.profile_steps, log
        )
    for _ in range(PROBES):  # a step's time depends on the anchors: probe again at the setting picked
        per_step = step_seconds(target, seqs, dataclasses.replace(base, anchors=anchors, epochs=1), args.device, log)
        left = args.seconds - (time.monotonic() - begin) - SAVE_MARGIN_S
        schedule = max(left, args.schedule_seconds or 0.0)  # this call's training, and the later calls' if any
        anchors, epochs = pick_schedule(counts, args.epochs, schedule / per_step * args.batch_anchors * PACKING_SLACK)
    tc = dataclasses.replace(base, anchors=anchors, epochs=epochs)
    later = (
        f"--prompts {args.prompts} --responses {args.responses} --out {args.out} --ckpt {args.ckpt} "
        f"--epochs {epochs} --anchors {anchors} --batch-anchors {args.batch_anchors} --layers {tc.layers} "
        f"--batch-tokens {tc.batch_tokens} --lr {tc.lr:g} --loop-repeats {tc.loop_repeats} --paced --resume "
        f"--schedule-seconds {schedule:.0f}"
        + (f" --source-weights {tc.source_weights}" if tc.source_weights else "")
        + (f" --target {args.target}" if args.target else "")
    )
    log(
        f"schedule: {epochs} epochs at {anchors} anchors per sequence over {schedule:.0f} s of training, {left:.0f} s "
        f"of it in this call; a later call on the same machine goes on with: python -m train.train_draft {later} "
        "--time-budget SECONDS"
    )
    if args.continue_args:
        pathlib.Path(args.continue_args).write_text(later + "\n")
    _, _, state = td.train(
        target,
        seqs,
        tc,
        args.device,
        log,
        pathlib.Path(args.ckpt),
        False,
        pathlib.Path(args.out),
        time_budget=left,
        init=pathlib.Path(args.init) if args.init else None,
        paced=True,
        schedule_seconds=schedule,
    )
    if args.log_json:
        td.write_log(
            pathlib.Path(args.log_json),
            tc,
            state,
            sequences=len(seqs),
            anchor_positions=int(counts.sum()),
            probe_step_seconds=per_step,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
