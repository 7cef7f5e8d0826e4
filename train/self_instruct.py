"""Self-instruct: the target writes user questions over a topic list (needs the GPU for volume).

    python -m train.self_instruct --out DIR [--addr MODELD | --target DIR --device cuda] [--per-topic 8]
        [--temperature 1.0] [--concurrency 256] [--time-budget S]
    python -m train.prompts build --out PROMPTS --extra DIR      # hold-out + dedupe, merged with the rest

For every (topic, kind of request) in train.templates' TOPICS x KINDS, --per-topic sampled requests ask the
target for a list of questions users ask; each numbered item, cleaned, is a new prompt. Exact
duplicates (after normalisation) are dropped here; near duplicates and evaluation items are dropped by the
build, which reads DIR/*.jsonl.gz as extra records tagged "self-instruct".
"""

import argparse
import asyncio
import gzip
import json
import pathlib
import random
import re
import sys
import time

from train import chat, templates
from train.dedupe import normalise, stable_hash

KINDS = [
    "a factual question",
    "a request for advice",
    "a request to write something creative",
    "a math word problem with numbers",
    "a request to explain a concept simply",
    "a coding question",
    "a question that needs step-by-step reasoning",
    "a request to summarise or compare ideas",
    "a request for a list or a plan",
    "a question a student might ask a teacher",
]
# A list asked for, not one question: the 135M target, asked for one question, mostly writes about the question
# ("A user asks: ...", "I can help with that"); asked for a list it mostly writes questions (a CPU trial of 12
# topics), and one request gives several.
ASK = "List five different questions that people ask an AI assistant about {topic}. Each one should be {kind}."
ITEM = re.compile(r"(?:^|\s)\d{1,2}[.)]\s+")  # "1. ", "2) " at a line's start or inline after a space


def clean(text: str) -> str | None:
    line = next((x.strip() for x in text.strip().splitlines() if x.strip()), "")
    line = line.replace("**", "").strip()
    line = re.sub(r"^(question|user|q)\s*[:.\-]\s*", "", line, flags=re.I).strip().strip('"').strip()
    line = line.rstrip(":").strip().strip('"').strip()
    return line if 15 <= len(line) <= 600 and not line.lower().startswith(("sure", "here is", "here's")) else None


def questions(text: str) -> list[str]:
    """The cleaned items of the answer's numbered list (items on their own lines or run together on one)."""
    found = []
    for line in text.splitlines():
        if not ITEM.match(line.strip()):
            continue
        for part in ITEM.split(" " + line.strip()):
            question = clean(part)
            if question is not None:
                found.append(question)
    return found


async def ask_all(address: str, tokenizer, args, out: pathlib.Path, log) -> int:
    import client

    jobs = [(t, k, i) for t in templates.TOPICS for k in KINDS for i in range(args.per_topic)]
    random.Random(args.seed).shuffle(jobs)
    seen, records, deadline = set(), [], time.monotonic() + args.time_budget
    queue = iter(jobs)
    async with client.AsyncClient(address, timeout=600, connect_timeout=60) as c:

        async def worker():
            for topic, kind, i in queue:
                if time.monotonic() > deadline:
                    return
                record = {"turns": [ASK.format(kind=kind, topic=topic)]}
                ids = chat.turn_prompt(tokenizer, record, [])
                seed = stable_hash(f"{topic}|{kind}|{i}|{args.seed}") % (2**31 - 1)
                result = await c.generate(
                    input_ids=ids, max_new_tokens=256, temperature=args.temperature, top_p=0.95, seed=seed
                )
                for question in questions(tokenizer.decode(list(result.output_ids), skip_special_tokens=True)):
                    if normalise(question) not in seen:
                        seen.add(normalise(question))
                        records.append({"source": "self-instruct", "turns": [question], "topic": topic, "kind": kind})

        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"self-instruct-{args.seed}.jsonl.gz"
    with gzip.open(path, "wt") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in records)
    log(f"{len(records)} questions from {len(jobs)} requests -> {path}")
    return len(records)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m train.self_instruct", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--addr")
    p.add_argument("--target")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--per-topic", type=int, default=8)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--time-budget", type=float, default=float("inf"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kv-budget-gb", type=float, default=20.0)
    p.add_argument("--page-size", type=int, default=64)
    p.add_argument("--chunked-prefill", type=int, default=4096)
    args = p.parse_args(argv)
    from transformers import AutoTokenizer

    if args.target is None:
        from modeld.model.fetch_default import ensure_default_model

        args.target = str(ensure_default_model())
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    if args.addr:
        asyncio.run(ask_all(args.addr, tokenizer, args, pathlib.Path(args.out), log))
    else:
        from train.generate import start_stack

        with start_stack(args) as address:
            asyncio.run(ask_all(address, tokenizer, args, pathlib.Path(args.out), log))
    return 0


if __name__ == "__main__":
    sys.exit(main())
