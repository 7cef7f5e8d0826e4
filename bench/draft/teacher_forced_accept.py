"""A draft's teacher-forced accept length on its training data against held-out chat, side by side in one run:
the trainer's own measure (`train.block_loss.block_loss` and `train.train_draft.accept_length`, every anchor of
each sequence) over the target's greedy answers. Close to the served accept length on the held-out side means trainer
and server agree; far above it on the training side means the draft learned its data, or its answers loop (a loop's
copies are accepted in long runs: the last column leaves them out, as the trainer's anchors do).

    python -m bench.draft.teacher_forced_accept [--draft modeld/default_draft] [--count 16] [--device cpu]
        [--responses train/data/responses] [--prompts .cache/train/prompts] [--sources chat-templates,...]
        [--same-sources DIR,DIR]

Training side: `--count` single-turn answers of `--sources` from the response packs (a seeded choice). Held-out
side: the target's greedy answers (128 new tokens, HF `generate`) to every fifth MT-Bench first turn of the
build's eval/mtbench.jsonl. `--same-sources`: per folder of prompts the packs do not answer (*.jsonl records)
with the target's answers to them (`python -m train.generate --prompts DIR --out DIR`), a row of its single-turn
answers and one of as many training answers of each of its sources: high on both is distribution shift from
MT-Bench, high on training answers alone is a draft that learned its answers.
"""

import argparse
import json
import pathlib
import random
import sys
from collections import Counter

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


def shuffled_answers(folder: str, seed: int) -> list[tuple[dict, list[list[int]]]]:
    """Every (meta, answers) of a folder's response shards, in a seeded order."""
    items = [x for path in responses.shard_paths(pathlib.Path(folder)) for x in responses.read_shard(path)]
    random.Random(seed).shuffle(items)
    return items


def answered_sequences(records: dict[str, dict], items, tokenizer, sources: set[str], count: int) -> list[dict]:
    """The first `count` single-turn answers of `sources` among `items`, as sequences (ids, answer spans, source)
    of their prompt records."""
    out = []
    for meta, answers in items:
        record = records.get(meta["id"])
        if record is not None and len(record["turns"]) == 1 and record["source"] in sources:
            ids, spans = chat.conversation(tokenizer, record, answers)
            out.append({"ids": np.asarray(ids, dtype=np.int32), "spans": spans, "source": record["source"]})
        if len(out) == count:
            break
    return out


def same_source_rows(args, tokenizer, records: dict[str, dict], items) -> list[tuple[str, list[dict]]]:
    """Per --same-sources folder: as many training answers of each of its sources as it has answers, then its
    own (held-out) answers."""
    rows = []
    for folder in filter(None, args.same_sources.split(",")):
        held_records = {r["id"]: r for r in read_records(pathlib.Path(folder))}
        sources = {r["source"] for r in held_records.values()}
        held = answered_sequences(
            held_records, shuffled_answers(folder, args.seed), tokenizer, sources, len(held_records)
        )
        counts = sorted(Counter(seq["source"] for seq in held).items())
        train = [seq for s, n in counts for seq in answered_sequences(records, items, tokenizer, {s}, n)]
        mix = ", ".join(f"{s} {n}" for s, n in counts)
        rows += [(f"training answers ({mix})", train), (f"held-out answers, same sources ({mix})", held)]
    return rows


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


def first_accepted(predictions: torch.Tensor, seq: dict, anchors: np.ndarray, weights: torch.Tensor) -> int:
    """How many of `anchors` accept their first drafted position (the token after the anchor)."""
    return round((td.accept_length(predictions[:, :1], [seq], [anchors], 2, weights[:, :1]) - 1) * len(anchors))


def accept_per_sequence(draft, target, seqs: list[dict], tc: td.TrainConfig, device: str) -> list[dict]:
    """Per sequence, over every anchor and over the anchors the trainer draws (none past tc.loop_repeats periods
    of a repetition loop, where every draft accepts long runs of copies): the teacher-forced accept length, the
    anchors, and how many accept the first drafted position. One forward; the kept figures from its rows."""
    out = []
    for seq in seqs:
        anchors = batches.valid_anchors(len(seq["ids"]), seq["spans"], tc.max_len)
        kept = np.isin(anchors, batches.anchor_positions(seq, tc.max_len, tc.loop_repeats))
        with torch.no_grad():
            _, predictions, weights = block_loss(draft, target, [seq], [anchors], tc, device)
        out.append(
            {
                "accept": td.accept_length(predictions, [seq], [anchors], tc.block, weights),
                "prose": td.accept_length(predictions[kept], [seq], [anchors[kept]], tc.block, weights[kept]),
                "anchors": len(anchors),
                "kept": int(kept.sum()),
                "first": first_accepted(predictions, seq, anchors, weights),
                "first_kept": first_accepted(predictions[kept], seq, anchors[kept], weights[kept]),
            }
        )
    return out


def table_row(name: str, per_seq: list[dict]) -> str:
    """One row of the table: means over the sequences, sums and shares over their anchors."""
    accepts, prose = [x["accept"] for x in per_seq], [x["prose"] for x in per_seq]
    anchors, kept = sum(x["anchors"] for x in per_seq), sum(x["kept"] for x in per_seq)
    first, first_kept = sum(x["first"] for x in per_seq) / anchors, sum(x["first_kept"] for x in per_seq) / kept
    return (
        f"| {name} | {len(per_seq)} | {anchors} / {kept} | {np.mean(accepts):.2f} | "
        f"{min(accepts):.2f} / {np.median(accepts):.2f} / {max(accepts):.2f} | {np.mean(prose):.2f} | "
        f"{first:.3f} / {first_kept:.3f} |"
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.draft.teacher_forced_accept", description=__doc__.splitlines()[0])
    p.add_argument("--draft", default=str(defaults.default_draft_dir()))
    p.add_argument("--target", help="default: the converted default model")
    p.add_argument("--responses", default="train/data/responses")
    p.add_argument("--prompts", default=".cache/train/prompts", help="the prompt build (its eval/ is held out)")
    p.add_argument("--sources", default=CHAT_SOURCES)
    p.add_argument("--same-sources", default="", help="comma-separated folders of held-out prompts and their answers")
    p.add_argument("--count", type=int, default=16)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    args.target = args.target or str(ensure_default_model())
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    target = (
        AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32)
        .to(args.device)
        .eval()
        .requires_grad_(False)
    )
    draft = load_draft(args.draft, target.config, torch.float32, args.device).eval()
    tc = td.TrainConfig(block=draft.spec.block_size, mask_token_id=draft.spec.mask_token_id)
    records = {r["id"]: r for r in read_records(pathlib.Path(args.prompts))}
    items = shuffled_answers(args.responses, args.seed)
    rows = [
        (
            f"training answers ({args.sources})",
            answered_sequences(records, items, tokenizer, set(args.sources.split(",")), args.count),
        ),
        *same_source_rows(args, tokenizer, records, items),
        ("held-out MT-Bench answers (every fifth first turn)", held_out_sequences(args, tokenizer, target)),
    ]
    print(
        f"draft {pathlib.Path(args.draft).name}, fp32 on {args.device}, block {tc.block}, every anchor of each "
        "sequence\n"
    )
    print(
        "| sequences | count | anchors (all / kept) | teacher-forced accept length | per sequence (min / median / max) "
        f"| without loop copies (anchors the trainer draws, --loop-repeats {tc.loop_repeats}) "
        "| first drafted position accepted (all / kept anchors) |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, seqs in rows:
        print(table_row(name, accept_per_sequence(draft, target, seqs, tc, args.device)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
