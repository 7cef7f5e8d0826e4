"""A draft training step's cost without the real model or data: a SmolLM2-135M-shaped target with random weights
(bench/configs/smollm2-135m) and random token sequences of chat-answer lengths, so that it runs on a bare GPU
machine. Two tables, each from one run:

1. the gather of each block's context window (train_draft.window_rows) against plain indexing, forward + backward,
   at a training step's shapes (indexing's backward sorts every index: 44 % of a step's device time on the H200);
2. training steps of the 4-layer draft at the given anchors per sequence: seconds per step and blocks per second
   (and, with --profile, the ops by their own device time).

    python -m bench.train_step [--anchors 23,128] [--batch-anchors 2048] [--steps 12] [--profile 3] [--before DIR]

With --before DIR (an earlier commit's train/ package: `git archive REV train | tar -x -C DIR`), the second table
times that trainer's steps too, in a child process of the same run, on the same random target and sequences.
"""

import argparse
import dataclasses
import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import torch

from train import fit_budget
from train import train_draft as td

CONFIG = pathlib.Path(__file__).parent / "configs" / "smollm2-135m"


def random_target(device: str):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(CONFIG)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=dtype).to(device).eval().requires_grad_(False)


def random_sequences(count: int, vocab: int, seed: int = 0) -> list[dict]:
    """Sequences of a 40-160 token prompt and a 100-700 token answer (the training data's answers average 277)."""
    rng = np.random.default_rng(seed)
    seqs = []
    for _ in range(count):
        prompt, answer = int(rng.integers(40, 160)), int(rng.integers(100, 700))
        ids = rng.integers(100, vocab, size=prompt + answer).astype(np.int32)
        seqs.append({"ids": ids, "spans": [(prompt, prompt + answer)], "source": "random"})
    return seqs


def timed(fn, repeats: int, device: str) -> float:
    """Mean seconds of fn() over `repeats` calls after one warm-up call."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    fn()
    sync()
    begin = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync()
    return (time.perf_counter() - begin) / repeats


def gather_table(device: str, blocks: int, anchors: int, width: int = 600, window: int = 256, repeats: int = 10) -> str:
    """Forward + backward of the context-window gather for one layer's K (fp32, as autocast leaves it), indexing
    against window_rows, with a step's rows: `anchors` random anchors per sequence of `width` positions, each
    reading the window - 1 positions before it, those before the sequence's start clamped to its first row (as
    block_loss does), so that neighbouring windows overlap and early ones repeat one row."""
    sequences = blocks // anchors
    gen = torch.Generator(device="cpu").manual_seed(0)
    ctx = torch.randn(sequences * width, 3, 64, generator=gen).to(device).requires_grad_(True)
    anchor = torch.randint(0, width - 16, (sequences * anchors,), generator=gen).to(device)
    seq_of = torch.arange(sequences, device=device).repeat_interleave(anchors)
    pos = anchor[:, None] - window + 1 + torch.arange(window - 1, device=device)
    rows = seq_of[:, None] * width + pos.clamp(min=0)
    grad = torch.randn(*rows.shape, 3, 64, generator=gen).to(device)

    def indexing():
        ctx[rows].backward(grad)

    def selecting():
        td.window_rows(ctx, rows).backward(grad)

    before, after = timed(indexing, repeats, device), timed(selecting, repeats, device)
    return ("| gather (one layer's K, fp32, forward + backward) | blocks | anchors per sequence | ms | x |\n"
            f"|---|---|---|---|---|\n| indexing: x[rows] | {len(rows)} | {anchors} | {before * 1e3:.2f} | 1.00 |\n"
            f"| train_draft.window_rows (index_select) | {len(rows)} | {anchors} | {after * 1e3:.2f} | "
            f"{before / after:.2f} |\n")


def step_seconds(target, seqs, anchors: int, batch_anchors: int, steps: int, device: str) -> float:
    """Seconds per training step of the 4-layer draft over `steps` steps after fit_budget's warm-up steps."""
    tc = dataclasses.replace(td.TrainConfig(batch_anchors=batch_anchors, layers=4), anchors=anchors)
    ends: list[float] = []
    td.train(target, seqs, tc, device, lambda _msg: None, max_steps=fit_budget.PROBE_WARMUP + steps, save_every=0,
             step_ends=ends)
    return (ends[-1] - ends[fit_budget.PROBE_WARMUP - 1]) / (len(ends) - fit_budget.PROBE_WARMUP)


def before_seconds(before: str, args, anchors: int) -> float:
    """step_seconds with the trainer in `before` (an earlier `train/` package), in a child process of this run."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([before, os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-m", "bench.train_step", "--steps-only", "--anchors", str(anchors),
                          "--batch-anchors", str(args.batch_anchors), "--sequences", str(args.sequences),
                          "--steps", str(args.steps), "--device", args.device],
                         env=env, check=True, capture_output=True, text=True).stdout
    return float(out.split()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.train_step", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--anchors", default="23,128", help="anchors per sequence, comma-separated: one row each")
    p.add_argument("--batch-anchors", type=int, default=2048)
    p.add_argument("--sequences", type=int, default=4000)
    p.add_argument("--steps", type=int, default=12, help="timed steps per row, after fit_budget's warm-up steps")
    p.add_argument("--profile", type=int, default=0, help="also profile this many steps at the first anchors")
    p.add_argument("--before", help="a folder holding an earlier train/ package (git archive REV train | tar -x -C "
                                    "DIR): its steps timed beside this tree's, in a child process")
    p.add_argument("--steps-only", action="store_true", help=argparse.SUPPRESS)  # --before's child: seconds alone
    args = p.parse_args(argv)
    target = random_target(args.device)
    seqs = random_sequences(args.sequences, target.config.vocab_size)
    anchor_rows = [int(a) for a in args.anchors.split(",")]
    if args.steps_only:
        print(step_seconds(target, seqs, anchor_rows[0], args.batch_anchors, args.steps, args.device))
        return 0
    for anchors in anchor_rows:
        print(gather_table(args.device, args.batch_anchors, anchors))
    print("| trainer | anchors per sequence | blocks per step | s per step | blocks per s | x |\n|---|---|---|---|---|---|")
    for anchors in anchor_rows:
        now = step_seconds(target, seqs, anchors, args.batch_anchors, args.steps, args.device)
        if args.before:
            then = before_seconds(args.before, args, anchors)
            print(f"| {args.before} | {anchors} | {args.batch_anchors} | {then:.3f} | {args.batch_anchors / then:,.0f} | 1.00 |")
        ratio = f"{then / now:.2f}" if args.before else "-"
        print(f"| this tree | {anchors} | {args.batch_anchors} | {now:.3f} | {args.batch_anchors / now:,.0f} | {ratio} |")
    if args.profile:
        tc = dataclasses.replace(td.TrainConfig(batch_anchors=args.batch_anchors, layers=4), anchors=anchor_rows[0])
        fit_budget.profile_steps(target, seqs, tc, args.device, args.profile, print)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
