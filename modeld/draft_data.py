"""Training data for a DFLASH draft: the target's own answers to prompts, generated through modeld.

    python -m modeld.draft_data --addr MODELD --target DIR --prompts prompts.jsonl --out seqs.jsonl \
        [--samples 3] [--max-new-tokens 320] [--temperature 0.8] [--top-p 0.95] [--concurrency 64]

prompts.jsonl: one {"prompt": "..."} per line, wrapped with the target's chat template. Per prompt, one
greedy answer and samples-1 sampled ones (seeded). Output lines: {"ids": prompt + answer, "response_start"}.
"""

import argparse
import concurrent.futures
import json
import sys

from transformers import AutoTokenizer

import client


def jobs(prompts: list[str], tokenizer, samples: int):
    for i, prompt in enumerate(prompts):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                            tokenize=True, return_dict=False)
        for k in range(samples):
            yield list(ids), (None if k == 0 else i * samples + k)  # seed None: greedy


def generate_all(addr: str, prompts: list[str], tokenizer, samples: int, max_new: int, temperature: float,
                 top_p: float, concurrency: int):
    with client.Client(addr, timeout=3600) as c:
        def one(job):
            ids, seed = job
            sampling = dict(temperature=0.0) if seed is None else dict(temperature=temperature, top_p=top_p, seed=seed)
            result = c.generate(input_ids=ids, max_new_tokens=max_new, **sampling)
            return {"ids": ids + list(result.output_ids), "response_start": len(ids)}

        with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
            yield from pool.map(one, jobs(prompts, tokenizer, samples))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m modeld.draft_data", description=__doc__.splitlines()[0])
    p.add_argument("--addr", help="modeld's address (default: its Unix socket)")
    p.add_argument("--target", required=True, help="the target's folder (for its tokenizer and chat template)")
    p.add_argument("--prompts", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--samples", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=320)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--concurrency", type=int, default=64)
    args = p.parse_args(argv)
    prompts = [json.loads(line)["prompt"] for line in open(args.prompts) if line.strip()]
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    with open(args.out, "w") as out:
        for n, record in enumerate(generate_all(args.addr, prompts, tokenizer, args.samples, args.max_new_tokens,
                                                args.temperature, args.top_p, args.concurrency), start=1):
            out.write(json.dumps(record) + "\n")
            if n % 100 == 0:
                print(f"{n} sequences", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
