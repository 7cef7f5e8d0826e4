"""Accept length and throughput of a DFLASH draft through the service, on held-out prompts.

For each draft block size, and once without the draft, in one script: memd (bounded draft pool at
--ratio) and modeld on the GPU, greedy answers to the prompts at batch 1 (the first --batch1
prompts) and at --concurrency (all of them), DFLASH verifying at every step. Prints one markdown row per
configuration: accept length (completion tokens / verify steps), tokens/s, the speed-up over no draft, and how
many greedy answers equal the no-draft answer (bf16: a near-tie may differ, tests/conftest.py's NEAR_TIE);
then the accept length per prompt category (the prompts' "category" field) at --concurrency, and per draft position the
share of verify steps that accepted it (from modeld's metrics, over the --concurrency run).

    python -m bench.draft.accept --prompts DIR/eval/mtbench.jsonl [--draft modeld/default_draft] [--blocks 8,16]
        [--baseline OTHER_DRAFT] [--max-new-tokens 128] [--batch1 8] [--concurrency 16] [--ratio 0.25] [--page 64]
"""

import argparse
import concurrent.futures
import json
import pathlib
import sys
import time

from transformers import AutoTokenizer

import client
from bench.common.metrics_scrape import metric_samples
from memd import defaults
from modeld.model.fetch_default import ensure_default_model
from train.stack import memd_args, run_memd, run_modeld


def run_set(address: str, prompts: list[list[int]], max_new: int, workers: int) -> tuple[int, int, float, list]:
    """(completion tokens, verify steps, seconds, per-prompt (tokens, verify steps, output ids)) for greedy
    answers."""
    with client.Client(address, timeout=1200) as c:
        go = lambda ids: c.generate(input_ids=ids, max_new_tokens=max_new, temperature=0)  # noqa: E731
        begin = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            results = list(pool.map(go, prompts))
        seconds = time.perf_counter() - begin
    each = [(len(r.output_ids), r.spec_verify_ct, tuple(r.output_ids)) for r in results]
    return sum(e[0] for e in each), sum(e[1] for e in each), seconds, each


def category_rows(categories: list[str], each_by_config: dict[str, list]) -> list[str]:
    """Accept length per prompt category (the prompts' "category" field), one column per DFLASH configuration."""
    rows = [
        "| category | prompts | " + " | ".join(f"accept length, {name}" for name in each_by_config) + " |",
        "|---|---|" + "---|" * len(each_by_config),
    ]
    for name in sorted(set(categories)):
        picked = [i for i, c in enumerate(categories) if c == name]
        cells = []
        for each in each_by_config.values():
            tokens = sum(each[i][0] for i in picked)
            steps = sum(each[i][1] for i in picked)
            cells.append(f"{tokens / max(1, steps):.2f}")
        rows.append(f"| {name} | {len(picked)} | " + " | ".join(cells) + " |")
    return rows


def verify_counts(modeld_log: str) -> tuple[float, dict[int, float]]:
    """(verify steps, {draft position: verify steps that accepted it}) so far, from the modeld's metrics endpoint."""
    drafts, per_position = 0.0, {}
    for sample in metric_samples(modeld_log, "modeld"):
        if sample.name == "modeld:spec_decode_num_drafts_total":
            drafts = sample.value
        elif sample.name == "modeld:spec_decode_num_accepted_tokens_per_pos_total":
            per_position[int(sample.labels["position"])] = sample.value
    return drafts, per_position


def position_rows(rates_by_config: dict[str, list[float]]) -> list[str]:
    """Per DFLASH configuration, the share of verify steps that accepted the draft at each position (1 = the first
    draft)."""
    width = max(map(len, rates_by_config.values()), default=0)
    rows = ["| config | " + " | ".join(str(k + 1) for k in range(width)) + " |", "|---|" + "---|" * width]
    for name, rates in rates_by_config.items():
        rows.append(f"| {name} | " + " | ".join(f"{r:.2f}" for r in rates) + " |" + " - |" * (width - len(rates)))
    return rows


def acceptance_rates(before: tuple[float, dict], after: tuple[float, dict]) -> list[float]:
    verifies = after[0] - before[0]
    return [(after[1][k] - before[1].get(k, 0.0)) / max(verifies, 1.0) for k in sorted(after[1])]


def draft_geometry(folder: str) -> tuple:
    """What memd's draft pool is sized by: the window, the layers, the KV heads and their size."""
    config = json.loads((pathlib.Path(folder) / "config.json").read_text())
    return tuple(config.get(k) for k in ("sliding_window", "num_hidden_layers", "num_key_value_heads", "head_dim"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.draft.accept", description=__doc__.splitlines()[0])
    p.add_argument("--prompts", required=True, help="JSON lines {prompt}, held out of the draft's training")
    p.add_argument("--draft", default=str(defaults.default_draft_dir()))
    p.add_argument("--target", help="target folder (default: the converted default model)")
    p.add_argument("--blocks", default="8,16")
    p.add_argument("--baseline", help="another draft (the shipped one, say) at the largest block, in the same run")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--batch1", type=int, default=8)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--ratio", type=float, default=0.25)
    p.add_argument("--page", type=int, default=64)
    p.add_argument("--device", default="cuda")
    args = p.parse_args(argv)
    target = pathlib.Path(args.target) if args.target else ensure_default_model()
    tokenizer = AutoTokenizer.from_pretrained(target)
    records = [json.loads(line) for line in open(args.prompts) if line.strip()]
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": r["prompt"]}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for r in records
    ]
    categories = [r.get("category", "all") for r in records]
    each_by_config, rates_by_config = {}, {}
    window = draft_geometry(args.draft)[0]
    blocks = [int(b) for b in args.blocks.split(",")]
    configs = [("no draft", None, None)] + [(f"DFLASH block {b}", args.draft, b) for b in blocks]
    if args.baseline:
        if draft_geometry(args.baseline) != draft_geometry(args.draft):
            p.error("--baseline needs the draft KV geometry of --draft (one memd's draft pool serves both)")
        configs.append((f"DFLASH block {max(blocks)}, baseline draft", args.baseline, max(blocks)))
    mem = memd_args(
        draft=pathlib.Path(args.draft),
        ratio=args.ratio,
        window=window,
        page=args.page,
        budget=4_000_000_000,
        max_running=max(args.concurrency, 8),
        chunk=2048,
        strict=False,
    )
    rows = [
        "| config | accept length | batch 1 tok/s | x | batch %d tok/s | x | output = no draft's |" % args.concurrency,
        "|---|---|---|---|---|---|---|",
    ]
    base = None
    with run_memd(target, *mem, "--kv-cache-dtype", "bfloat16", device=args.device) as memd:
        for name, draft, block in configs:
            # The draft verifies at every step, however many requests run (modeld's default turns speculation off
            # from 16 running, which the --concurrency run reaches): this measures the draft, not that policy.
            extra = (
                ["--speculative-algorithm", "none"]
                if block is None
                else [
                    "--draft-model",
                    draft,
                    "--num-draft-tokens",
                    str(block),
                    "--metrics-port",
                    "0",
                    "--speculative-disable-by-batch-size",
                    "0",
                ]
            )
            with run_modeld(memd, "--target-model", str(target), *extra, device=args.device) as modeld:
                run_set(modeld.address, prompts[:2], 16, 1)  # warm-up (Triton compiles)
                one = run_set(modeld.address, prompts[: args.batch1], args.max_new_tokens, 1)
                before = verify_counts(modeld.log()) if block else None
                many = run_set(modeld.address, prompts, args.max_new_tokens, args.concurrency)
                if block:
                    rates_by_config[name] = acceptance_rates(before, verify_counts(modeld.log()))
            speeds = (one[0] / one[2], many[0] / many[2])
            base = base or speeds
            if block is None:
                plain = [e[2] for e in many[3]]
            else:
                each_by_config[name] = many[3]
            same = sum(e[2] == out for e, out in zip(many[3], plain))
            accept = "-" if block is None else f"{many[0] / many[1]:.2f}"
            rows.append(
                f"| {name} | {accept} | {speeds[0]:.1f} | {speeds[0] / base[0]:.2f} | {speeds[1]:.1f} "
                f"| {speeds[1] / base[1]:.2f} | {same}/{len(plain)} |"
            )
            print(rows[-1], file=sys.stderr, flush=True)
    print(f"{len(prompts)} prompts, {args.max_new_tokens} new tokens, ratio {args.ratio}, page {args.page}")
    print("\n".join(rows))
    print()
    print("\n".join(category_rows(categories, each_by_config)))
    print("\nShare of verify steps that accepted the draft at each position:\n")
    print("\n".join(position_rows(rates_by_config)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
