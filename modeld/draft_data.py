"""Training data for a DFLASH draft: the target's own answers to prompts, generated through modeld
(`--engine modeld`, the default) or by HF `generate` in large left-padded batches on the target's folder
(`--engine hf`: no daemons, and faster than our batch-8-tuned serving for bulk offline generation).

    python -m modeld.draft_data --target DIR --prompts prompts.jsonl --out seqs.jsonl [--addr MODELD]
        [--engine modeld|hf] [--samples 3] [--max-new-tokens 320] [--temperature 0.8] [--top-p 0.95]
        [--concurrency 64] [--batch 256] [--max-seconds S]

prompts.jsonl: one {"prompt": "..."} per line, wrapped with the target's chat template. Per prompt, one
greedy answer and samples-1 sampled ones (seeded). Output lines: {"ids": prompt + answer, "response_start"}.
With --max-seconds, generation stops starting new work after that long (what is done is kept).
"""

import argparse
import concurrent.futures
import json
import sys
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

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


def generate_hf(target: str, prompts: list[str], tokenizer, samples: int, max_new: int, temperature: float,
                top_p: float, batch: int, deadline: float):
    """HF generate over batches of similar prompt length (little padding); greedy and sampled jobs apart."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(target, dtype=dtype).to(device).eval()
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    todo = sorted(jobs(prompts, tokenizer, samples), key=lambda job: (job[1] is not None, len(job[0])))
    for first in range(0, len(todo), batch):
        if time.monotonic() > deadline:
            return
        group = todo[first : first + batch]
        greedy = [job for job in group if job[1] is None]
        for part in (greedy, [job for job in group if job[1] is not None]):
            if part:
                yield from _hf_batch(model, part, max_new, temperature, top_p, eos, pad, device)


def _hf_batch(model, part, max_new, temperature, top_p, eos, pad, device):
    width = max(len(ids) for ids, _ in part)
    ids = torch.tensor([[pad] * (width - len(i)) + i for i, _ in part], device=device)
    mask = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i, _ in part], device=device)
    sampled = part[0][1] is not None
    if sampled:
        torch.manual_seed(part[0][1])
    sampling = dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0) if sampled else dict(do_sample=False)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=max_new, pad_token_id=pad, eos_token_id=eos,
                             **sampling)[:, width:].tolist()
    for (prompt, _), answer in zip(part, out):
        answer = answer[: answer.index(eos) + 1] if eos in answer else answer
        yield {"ids": prompt + answer, "response_start": len(prompt)}


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
    p.add_argument("--engine", choices=["modeld", "hf"], default="modeld")
    p.add_argument("--batch", type=int, default=256, help="--engine hf: sequences per generate call")
    p.add_argument("--max-seconds", type=float, default=float("inf"), help="--engine hf: start no batch after this")
    args = p.parse_args(argv)
    prompts = [json.loads(line)["prompt"] for line in open(args.prompts) if line.strip()]
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    if args.engine == "hf":
        records = generate_hf(args.target, prompts, tokenizer, args.samples, args.max_new_tokens, args.temperature,
                              args.top_p, args.batch, time.monotonic() + args.max_seconds)
    else:
        records = generate_all(args.addr, prompts, tokenizer, args.samples, args.max_new_tokens, args.temperature,
                               args.top_p, args.concurrency)
    with open(args.out, "w") as out:
        for n, record in enumerate(records, start=1):
            out.write(json.dumps(record) + "\n")
            if n % 100 == 0:
                print(f"{n} sequences", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
