"""The draft trainer's speed without the real model or data: a SmolLM2-135M-shaped target with random weights
(bench/configs/smollm2-135m) and random token sequences of chat-answer lengths, so that it runs on a bare GPU
machine. One table: training steps of the 4-layer draft at each anchors-per-sequence setting, with seconds per
step, anchors (blocks) per second, model FLOP utilisation and peak memory.

    python -m bench.draft.train_step [--anchors 512] [--batch-anchors 4096] [--steps 12] [--profile 3]
        [--before DIR[,DIR]]

With --before DIR (an earlier commit's train/ package: `git archive REV train | tar -x -C DIR`; several,
comma-separated), that trainer is timed too at each anchors setting's first --batch-anchors (the earlier trainer
materialises every block's context
window and full logits: larger batches may not fit), in a child process of the same run, on the same random
target and sequences; the x column is each row's anchors per second over it.

MFU counts the work a step must do, the same for both trainers: the draft's projections and MLP over every block
row and context row (forward and backward), attention over a full window and the block for every block row, the
frozen LM head's forward and input gradient at every labelled row, and the target's forward; over the card's dense
bf16 peak.
"""

import argparse
import dataclasses
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import torch

from train import fit_budget
from train import train_draft as td

CONFIG = pathlib.Path(__file__).parents[1] / "configs" / "smollm2-135m"
DENSE_BF16_TFLOPS = {"H100": 989.4, "H200": 989.4}  # the datasheets' dense bf16 rate (SXM)


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


def train_config(anchors: int, batch_anchors: int) -> td.TrainConfig:
    """The 4-layer draft's settings (an earlier trainer's TrainConfig may lack some of today's fields)."""
    wanted = {
        "layers": 4,
        "anchors": anchors,
        "batch_anchors": batch_anchors,
        "batch_tokens": max(4 * batch_anchors, td.TrainConfig.max_len),
    }
    known = {f.name for f in dataclasses.fields(td.TrainConfig)}
    return td.TrainConfig(**{k: v for k, v in wanted.items() if k in known})


def anchor_flops(target_cfg, tc: td.TrainConfig, context_per_anchor: float, seen_keys: float) -> float:
    """FLOPs a trained anchor costs (see the module's docstring); context_per_anchor: sequence tokens per anchor;
    seen_keys: the keys a block row attends to."""
    h, inter, vocab = target_cfg.hidden_size, target_cfg.intermediate_size, target_cfg.vocab_size
    heads, kv, d = target_cfg.num_attention_heads, target_cfg.num_key_value_heads, target_cfg.head_dim
    layer = h * heads * d * 2 + 2 * h * kv * d + 3 * h * inter  # q, o, k, v, gate, up, down (draft and target alike)
    taps = len(td.build_target_layer_ids(target_cfg.num_hidden_layers, tc.layers))
    block_rows = 6 * tc.layers * layer * tc.block + 3 * 4 * heads * d * seen_keys * tc.layers * tc.block
    head = 4 * h * vocab * (tc.block - 1)
    context = 6 * (taps * h * h + tc.layers * 2 * h * kv * d) * context_per_anchor
    target = 2 * target_cfg.num_hidden_layers * layer * context_per_anchor
    return block_rows + head + context + target


def step_figures(target, seqs, anchors: int, batch_anchors: int, steps: int, device: str) -> dict:
    """Seconds per step over `steps` steps after fit_budget's warm-up steps, anchors per step and per second, the
    sequence tokens per anchor and the peak memory of the timed steps."""
    tc = train_config(anchors, batch_anchors)
    plan = fit_budget.batches.epoch_batches(seqs, tc, 0)[fit_budget.PROBE_WARMUP : fit_budget.PROBE_WARMUP + steps]
    counts = [
        min(anchors, len(fit_budget.batches.anchor_positions(seqs[i], tc.max_len, tc.loop_repeats)))
        for b in plan
        for i in b
    ]
    tokens = sum(min(len(seqs[i]["ids"]), tc.max_len) for b in plan for i in b)
    if device.startswith("cuda"):  # the warm-up steps (compilation) stay out of the peak
        td.train(target, seqs, tc, device, lambda _msg: None, max_steps=fit_budget.PROBE_WARMUP, save_every=0)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    ends: list[float] = []
    td.train(
        target,
        seqs,
        tc,
        device,
        lambda _msg: None,
        max_steps=fit_budget.PROBE_WARMUP + steps,
        save_every=0,
        step_ends=ends,
    )
    seconds = (ends[-1] - ends[fit_budget.PROBE_WARMUP - 1]) / (len(ends) - fit_budget.PROBE_WARMUP)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else 0.0
    per_step = sum(counts) / len(plan)
    return {
        "seconds": seconds,
        "anchors_per_step": per_step,
        "anchors_per_s": per_step / seconds,
        "tokens_per_anchor": tokens / sum(counts),
        "peak_gib": peak,
    }


def before_figures(before: str, args, anchors: int, batch_anchors: int) -> dict:
    """step_figures with the trainer in `before` (an earlier `train/` package), in a child process of this run."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([before, os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.draft.train_step",
            "--steps-only",
            "--anchors",
            str(anchors),
            "--batch-anchors",
            str(batch_anchors),
            "--sequences",
            str(args.sequences),
            "--steps",
            str(args.steps),
            "--device",
            args.device,
        ],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out.splitlines()[-1])


def peak_tflops(device: str) -> float | None:
    if not device.startswith("cuda"):
        return None
    name = torch.cuda.get_device_name()
    return next((rate for card, rate in DENSE_BF16_TFLOPS.items() if card in name), None)


def row(name: str, anchors: int, figures: dict, flops: float, peak: float | None, base: dict | None) -> str:
    mfu = f"{figures['anchors_per_s'] * flops / (peak * 1e12):.1%}" if peak else "-"
    ratio = f"{figures['anchors_per_s'] / base['anchors_per_s']:.2f}" if base else "1.00"
    return (
        f"| {name} | {anchors} | {figures['anchors_per_step']:,.0f} | {figures['seconds']:.3f} | "
        f"{figures['anchors_per_s']:,.0f} | {mfu} | {figures['peak_gib']:.1f} | {ratio} |"
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.draft.train_step", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--anchors", default="512", help="anchors per sequence, comma-separated: one row each")
    p.add_argument("--batch-anchors", default="4096", help="anchors a step at most, comma-separated: one row each")
    p.add_argument("--sequences", type=int, default=4000)
    p.add_argument("--steps", type=int, default=12, help="timed steps per row, after fit_budget's warm-up steps")
    p.add_argument("--profile", type=int, default=0, help="also profile this many steps of the first row")
    p.add_argument("--trace", help="with --profile: write the profile as a Chrome trace here (.gz: compressed)")
    p.add_argument(
        "--before",
        help="folders, comma-separated, each holding an earlier train/ package (git archive REV "
        "train | tar -x -C DIR): its steps timed beside this tree's, in a child process; "
        "the first is the baseline",
    )
    p.add_argument("--steps-only", action="store_true", help=argparse.SUPPRESS)  # --before's child: figures alone
    args = p.parse_args(argv)
    target = random_target(args.device)
    seqs = random_sequences(args.sequences, target.config.vocab_size)
    settings = [(int(a), int(b)) for a in args.anchors.split(",") for b in args.batch_anchors.split(",")]
    if args.steps_only:
        print(json.dumps(step_figures(target, seqs, *settings[0], args.steps, args.device)))
        return 0
    peak = peak_tflops(args.device)
    card = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    print(f"{card}; MFU over {peak or '-'} TFLOP/s dense bf16\n")
    print(
        "| trainer | anchors per sequence | anchors per step | s per step | anchors per s | MFU | peak GiB | x |\n"
        "|---|---|---|---|---|---|---|---|"
    )
    base, base_anchors = None, None
    for anchors, batch_anchors in settings:
        tc = train_config(anchors, batch_anchors)
        now = step_figures(target, seqs, anchors, batch_anchors, args.steps, args.device)
        flops = anchor_flops(target.config, tc, now["tokens_per_anchor"], tc.window - 1 + tc.block)
        if args.before and base_anchors != anchors:  # at each anchors' first batch size
            for i, before in enumerate(args.before.split(",")):  # the first is the x column's baseline
                figures = before_figures(before, args, anchors, batch_anchors)
                print(row(before, anchors, figures, flops, peak, base if i else None), flush=True)
                if i == 0:
                    base, base_anchors = figures, anchors
        print(row("this tree", anchors, now, flops, peak, base), flush=True)
    if args.profile:
        fit_budget.profile_steps(
            target, seqs, train_config(*settings[0]), args.device, args.profile, print, trace=args.trace
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
