"""A draft's teacher-forced accept length on its training data against held-out chat, side by side in one run:
the trainer's own measure (`train.block_loss.block_loss` and `train.train_draft.accept_length`, every anchor of
each sequence) over the target's greedy answers. Close to the served accept length on the held-out side means trainer
and
server agree; far above it on the training side means the draft learned its data, or its answers loop (a loop's
copies are accepted in long runs: the last column leaves them out, as the trainer's anchors do).

    python -m bench.draft.teacher_forced_accept [--draft modeld/default_draft] [--count 16] [--device cpu]
        [--responses train/data/responses] [--prompts .cache/train/prompts] [--sources chat-templates,...]

Training side: `--count` single-turn answers of `--sources` from the response packs (a seeded choice). Held-out
side: the target's greedy answers (128 new tokens, HF `generate`) to every fifth MT-Bench first turn of the
build's eval/mtbench.jsonl.
"""

import argparse
import json
import pathlib
import random
import sys

import numpy as np
import torch

from memd import defaults
from modeld.model.fetch_default import ensure_default_model
from modeld.spec.draft import load_draft
from train import batches, chat, responses
from train import train_draft as td
from train.block_loss import block_loss
from train.prompts import read_records

CHAT_SOURCES = "chat-templates,openai-evals,math-word,python-code"


def training_sequences(args, tokenizer) -> list[dict]:
    records = {r["id"]: r for r in read_records(pathlib.Path(args.prompts))}
    sources = set(args.sources.split(","))
    items = [x for path in responses.shard_paths(pathlib.Path(args.responses)) for x in responses.read_shard(path)]
    random.Random(args.seed).shuffle(items)
    out = []
    for meta, answers in items:
        record = records.get(meta["id"])
        if record is not None and len(record["turns"]) == 1 and record["source"] in sources:
            ids, spans = chat.conversation(tokenizer, record, answers)
            out.append({"ids": np.asarray(ids, dtype=np.int32), "spans": spans})
        if len(out) == args.count:
            break
    return out


def held_out_sequences(args, tokenizer, target) -> list[dict]:
    questions = [
        json.loads(x) for x in (pathlib.Path(args.prompts) / "eval" / "mtbench.jsonl").read_text().splitlines()
    ]
    out = []
    for question in questions[::5][: args.count]:
        record = {"id": "mtbench", "turns": [question["prompt"]]}
        prompt = chat.turn_prompt(tokenizer, record, [])
        ids = torch.tensor([prompt], device=args.device)
        with torch.no_grad():
            answer = target.generate(ids, max_new_tokens=128, do_sample=False, attention_mask=torch.ones_like(ids))
        ids, spans = chat.conversation(tokenizer, record, [answer[0, len(prompt) :].tolist()])
        out.append({"ids": np.asarray(ids, dtype=np.int32), "spans": spans})
    return out


def accept_per_sequence(draft, target, seqs: list[dict], tc: td.TrainConfig, device: str) -> list[tuple[float, float]]:
    """Teacher-forced accept length of each sequence over every anchor, and over the anchors the trainer draws
    (none past tc.loop_repeats periods of a repetition loop, where every draft accepts long runs of copies): one
    forward, the second figure from its rows at the kept anchors."""
    out = []
    for seq in seqs:
        anchors = batches.valid_anchors(len(seq["ids"]), seq["spans"], tc.max_len)
        kept = np.isin(anchors, batches.anchor_positions(seq, tc.max_len, tc.loop_repeats))
        with torch.no_grad():
            _, predictions, weights = block_loss(draft, target, [seq], [anchors], tc, device)
        out.append(
            (
                td.accept_length(predictions, [seq], [anchors], tc.block, weights),
                td.accept_length(predictions[kept], [seq], [anchors[kept]], tc.block, weights[kept]),
            )
        )
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.draft.teacher_forced_accept", description=__doc__.splitlines()[0])
    p.add_argument("--draft", default=str(defaults.default_draft_dir()))
    p.add_argument("--target", help="default: the converted default model")
    p.add_argument("--responses", default="train/data/responses")
    p.add_argument("--prompts", default=".cache/train/prompts", help="the prompt build (its eval/ is held out)")
    p.add_argument("--sources", default=CHAT_SOURCES)
    p.add_argument("--count", type=int, default=16)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    args.target = args.target or str(ensure_default_model())
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).to(args.device).eval()
    draft = load_draft(args.draft, target.config, torch.float32, args.device).eval()
    tc = td.TrainConfig(block=draft.spec.block_size, mask_token_id=draft.spec.mask_token_id)
    rows = [
        ("training answers (" + args.sources + ")", training_sequences(args, tokenizer)),
        ("held-out MT-Bench answers (every fifth first turn)", held_out_sequences(args, tokenizer, target)),
    ]
    print(
        f"draft {pathlib.Path(args.draft).name}, fp32 on {args.device}, block {tc.block}, every anchor of each "
        "sequence\n"
    )
    print(
        "| sequences | count | teacher-forced accept length | per sequence (min / median / max) "
        f"| without loop copies (anchors the trainer draws, --loop-repeats {tc.loop_repeats}) |"
    )
    print("|---|---|---|---|---|")
    for name, seqs in rows:
        accepts, prose = zip(*accept_per_sequence(draft, target, seqs, tc, args.device))
        print(
            f"| {name} | {len(seqs)} | {np.mean(accepts):.2f} | "
            f"{min(accepts):.2f} / {np.median(accepts):.2f} / {max(accepts):.2f} | {np.mean(prose):.2f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
