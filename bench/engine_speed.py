"""Decode speed of modeld's engine, side by side in one run: Hugging Face `generate`, modeld as it ran before graphs
(eager, one memd call per step), modeld with CUDA graphs and decode slots granted ahead, and DFLASH; at batch 1 and
at each --concurrency; with a per-step breakdown (forward, draft, sampling, memd, host) and MBU; and, for the graph
configurations, requests that sample (temperature 0.8) at each --sampled-concurrency (batch 1 and 16). The graph
configurations run one decode step (or DFLASH verify step) per replay, and again with up to 4 per replay (modeld's
default, --steps-per-replay).

    python -m bench.engine_speed [--target DIR] [--load-format dummy] [--draft DIR|none] [--new-tokens 128]
    [--ignore-eos]
        [--concurrency 16,64] [--sampled-concurrency 1,16] [--rounds 3] [--page 16] [--ratio 0.25] [--skip-hf]
        [--variants 1,2,...]

One memd (a child process, on the GPU, with a bounded draft pool when there is a draft) serves every modeld
configuration in turn; each modeld runs in this process (its engine thread, no gRPC), so the breakdown can time
its phases. Breakdown runs are separate from the throughput runs: they synchronise the device after each phase.
"""

import argparse
import gc
import json
import pathlib
import sys
import time

import torch

from bench.engine_variants import SERVED, VARIANTS, Variant, variant_config
from bench.memd_process import memd_process
from bench.step_breakdown import Breakdown
from modeld.detokenize import TextStream
from modeld.engine.build import build_engine
from modeld.engine.loop import make_generator
from modeld.model.fetch_default import ensure_default_model
from modeld.request import Request
from modeld.sampling_params import SamplingParams

SAMPLED_TEMPERATURE, SAMPLED_TOP_P = 0.8, 0.95  # the requests that sample (DFLASH's split path, not the greedy cycle)
# bytes/s, the datasheets' HBM figures by card name (an H200's device copy measured about 4.3e12); MBU is "-" on others
BANDWIDTH = {"H200": 4.8e12, "H100 80GB HBM3": 3.35e12, "H100 PCIe": 2.0e12}
CHAT = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers.",
    "Explain recursion to a child in two sentences.",
    "Why is the sky blue?",
    "Name a famous painting and its painter.",
    "Give me a recipe for pancakes.",
    "How do vaccines work?",
    "Write a short story about a robot learning to paint.",
    "What are the benefits of exercise?",
    "Describe the water cycle.",
    "Explain what a black hole is.",
    "Suggest three names for a bakery.",
    "How do I reverse a list in Python?",
    "What causes seasons on Earth?",
    "Summarise the plot of Romeo and Juliet.",
]


def bandwidth() -> float | None:
    """The card's datasheet memory bandwidth (bytes/s), or None for a card not in BANDWIDTH."""
    name = torch.cuda.get_device_name()
    return next((bw for key, bw in BANDWIDTH.items() if key in name), None)


def mbu(weight_bytes: int, steps_per_second: float) -> str:
    """Model bandwidth utilisation: the weights read per second over the card's bandwidth."""
    peak = bandwidth()
    return "-" if peak is None else f"{weight_bytes * steps_per_second / peak:.0%}"


def largest_batch(args) -> int:
    """The largest batch of any run (greedy or sampled): memd's running requests, the prompts a run needs."""
    return max(args.concurrency + args.sampled_concurrency)


def memd_args(target: str, draft: str | None, args) -> list[str]:
    """memd on the GPU for every configuration: bf16 KV, a bounded draft pool when there is a draft."""
    flags = [
        "--device",
        "cuda",
        "--target-model",
        target,
        "--page-size",
        str(args.page),
        "--max-running-requests",
        str(largest_batch(args)),
        "--mem-fraction",
        "0.3",
        "--kv-cache-dtype",
        "bfloat16",
        "--decode-lookahead",
        "96",
        "--draft-model",
        draft or "none",
    ]  # the lookahead: the most a variant asks for
    if draft:
        flags += ["--draft-kv-ratio", str(args.ratio), "--draft-window", str(args.window)]
    return flags


def prompts_for(target: str, load_format: str, count: int) -> list[list[int]]:
    """`count` chat prompts in the target's template; with dummy weights, random ids of its vocabulary (seeded)."""
    from transformers import AutoConfig, AutoTokenizer

    if load_format == "dummy":
        gen = torch.Generator().manual_seed(0)
        vocab = AutoConfig.from_pretrained(target).vocab_size
        return [torch.randint(100, vocab, (24,), generator=gen).tolist() for _ in range(count)]
    tokenizer = AutoTokenizer.from_pretrained(target)
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": CHAT[i % len(CHAT)]}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        for i in range(count)
    ]


def submit_requests(
    engine, prompts: list[list[int]], new_tokens: int, ignore_eos: bool, tag: str, temperature: float = 0.0
) -> list[Request]:
    """One request per prompt, submitted to the engine: greedy, or sampled at `temperature` (top-p SAMPLED_TOP_P,
    seeded per request, so every configuration samples the same way)."""
    reqs = []
    for i, p in enumerate(prompts):
        params = SamplingParams(
            max_new_tokens=new_tokens,
            temperature=temperature,
            ignore_eos=ignore_eos,
            top_p=SAMPLED_TOP_P if temperature else 1.0,
            seed=i if temperature else None,
        )
        generator = None if params.greedy else make_generator(params.seed, "cuda")  # as modeld's service makes it
        reqs.append(Request(rid=f"{tag}-{i}", prompt_ids=list(p), params=params, generator=generator))
    for r in reqs:
        assert engine.submit(r)
    return reqs


def generate_all(
    engine,
    prompts: list[list[int]],
    new_tokens: int,
    ignore_eos: bool,
    tag: str,
    temperature: float = 0.0,
    first_tokens: list[tuple[float, int]] | None = None,
) -> tuple[int, float, int]:
    """Submits every prompt at once; (generated tokens, seconds, verify steps) when all completed. This thread makes
    each request's text from its streamed ids, as a gRPC handler does (modeld.front.service), beside the engine's thread.
    With `first_tokens`, each request's first streamed tokens go there: (seconds from the submission, how many)."""
    begin = time.perf_counter()
    reqs = submit_requests(engine, prompts, new_tokens, ignore_eos, tag, temperature)
    for r in reqs:
        text = TextStream(engine.output.tokenizer, [])
        while True:
            kind, *payload = r.events.get(timeout=600)
            if kind == "complete":
                break
            if first_tokens is not None and not text.ids and payload[0]:
                first_tokens.append((time.perf_counter() - begin, len(payload[0])))
            text.add(payload[0], payload[2])
    seconds = time.perf_counter() - begin
    failed = [r.finish for r in reqs if r.finish.reason == "abort"]
    assert not failed, failed
    return sum(len(r.output_ids) for r in reqs), seconds, sum(r.spec_verify_ct for r in reqs)


def weight_bytes(model) -> int:
    """Bytes a decode step reads: every weight once (the embedding table only if it is not also the LM head)."""
    embed = model.model.embed_tokens.weight
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    return total - (0 if model.lm_head.weight is embed else embed.numel() * embed.element_size())


def batches(concurrency: int, prompts: list[list[int]], batch1: int, rounds: int) -> list[list[list[int]]]:
    """The request batches of a run at this concurrency: at 1, the first `batch1` prompts one at a time (one short
    answer would weigh its admission against a handful of steps); else `rounds` batches of that many prompts, each
    starting one prompt further (one batch of 16 short answers lasts about a third of a second: too noisy alone)."""
    if concurrency == 1:
        return [[p] for p in prompts[:batch1]]
    return [[prompts[(i + k) % len(prompts)] for i in range(concurrency)] for k in range(rounds)]


def run_batches(
    engine,
    concurrency: int,
    prompts,
    args,
    ignore_eos: bool,
    tag: str,
    temperature: float = 0.0,
    first_tokens: list[tuple[float, int]] | None = None,
) -> tuple[int, float, int]:
    """(generated tokens, seconds, verify steps) over every batch of a run at this concurrency."""
    done = [
        generate_all(engine, batch, args.new_tokens, ignore_eos, f"{tag}-{k}", temperature, first_tokens)
        for k, batch in enumerate(batches(concurrency, prompts, args.batch1, args.rounds))
    ]
    return sum(d[0] for d in done), sum(d[1] for d in done), sum(d[2] for d in done)


def run_variant(v: Variant, memd: str, args, prompts, ignore_eos: bool, breakdown: bool = True) -> dict:
    """One configuration's tokens/s (and, with `breakdown`, its per-step breakdown at batch 1 and 16)."""
    built = build_engine(variant_config(v, memd, args), lambda serving: None)
    engine = built.engine
    graphs = engine.runner.graphs
    if graphs is not None:
        if not v.prompt_graphs:  # one request's chunk then has a graph only in a verify block's shape, as before
            graphs.lone_tokens = [q for q in graphs.tokens_per_request if q > 1]
    engine.start()
    try:
        generate_all(engine, prompts[:2], 8, True, "warm")
        row = {"name": v.name, "graphs": v.graphs, "steps": v.steps, "always_speculates": not v.speculate_below}
        firsts = []
        tokens, seconds, verifies = run_batches(engine, 1, prompts, args, ignore_eos, "b1", first_tokens=firsts)
        row["bs1"] = tokens / seconds
        # one request at a time: its first tokens (admission, prefill, the first step), then its decoding
        row["first_ms1"] = 1000 * sum(t for t, _ in firsts) / len(firsts)
        row["decode1"] = (tokens - sum(n for _, n in firsts)) / (seconds - sum(t for t, _ in firsts))
        row["accept"] = tokens / verifies if verifies else None
        for c in args.concurrency:
            tokens, seconds, _ = run_batches(engine, c, prompts, args, ignore_eos, f"c{c}")
            row[f"c{c}"] = tokens / seconds
        if v.graphs:  # sampled requests: DFLASH's split path against plain decoding
            for c in args.sampled_concurrency:
                tokens, seconds, verifies = run_batches(
                    engine, c, prompts, args, ignore_eos, f"t{c}", SAMPLED_TEMPERATURE
                )
                row[f"sampled{c}"] = tokens / seconds
                row[f"sampled_accept{c}"] = tokens / verifies if verifies else None
        for c in (1, 16) if breakdown else ():
            prof = Breakdown(engine)
            run_batches(engine, c, prompts, args, ignore_eos, f"prof{c}")
            row[f"breakdown{c}"] = prof.close()
        row["weight_bytes"] = weight_bytes(engine.runner.model)
        return row
    finally:
        engine.stop()
        built.link.close()
        del engine, built
        gc.collect()  # the engine's parts refer to each other (rebinders, the breakdown's wrappers): free the model now
        torch.cuda.empty_cache()


def hf_generate(args, prompts, ignore_eos: bool) -> float:
    from transformers import AutoConfig, AutoModelForCausalLM

    if args.load_format == "dummy":
        with torch.device("cuda"):  # random weights drawn on the GPU: an 8B model in seconds
            hf = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(args.target), dtype=torch.bfloat16)
    else:
        hf = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.bfloat16)
    hf = hf.cuda().eval()
    tokens = seconds = 0
    for p in prompts[: args.batch1]:
        ids = torch.tensor([p], device="cuda")
        extra = dict(min_new_tokens=args.new_tokens) if ignore_eos else {}
        torch.cuda.synchronize()
        begin = time.perf_counter()
        out = hf.generate(
            ids, max_new_tokens=args.new_tokens, do_sample=False, attention_mask=torch.ones_like(ids), **extra
        )
        torch.cuda.synchronize()
        seconds += time.perf_counter() - begin
        tokens += out.shape[1] - ids.shape[1]
    del hf
    torch.cuda.empty_cache()
    return tokens / seconds


def report(rows: list[dict], hf: float | None, args) -> str:
    plain = next(r for r in rows if r["name"] == "modeld graphs + lookahead")  # the ratios' reference
    cs = args.concurrency
    lines = [
        f"GPU: {torch.cuda.get_device_name()}; target {pathlib.Path(args.target).name} ({args.load_format}), "
        f"{args.new_tokens} new tokens{' every request (ignore_eos)' if args.ignore_eos else ''}, greedy, "
        f"page {args.page}",
        "",
        "| config | accept length | batch 1 tok/s | x HF | x plain | "
        + " | ".join(f"{c} concurrent tok/s | x plain" for c in cs)
        + " |",
        "|---|---|---|---|---|" + "---|---|" * len(cs),
    ]
    if hf is not None:
        lines.append(
            f"| HF generate (eager, bs 1) | - | {hf:.1f} | 1.00 | {hf / plain['bs1']:.2f} | "
            + " | ".join("- | -" for _ in cs)
            + " |"
        )
    for r in rows:
        accept = "-" if r["accept"] is None else f"{r['accept']:.2f}"
        xhf = f"{r['bs1'] / hf:.2f}" if hf else "-"
        lines.append(
            f"| {r['name']} | {accept} | {r['bs1']:.1f} | {xhf} | {r['bs1'] / plain['bs1']:.2f} | "
            + " | ".join(f"{r[f'c{c}']:.1f} | {r[f'c{c}'] / plain[f'c{c}']:.2f}" for c in cs)
            + " |"
        )
    lines += [
        "",
        "Batch 1, one request at a time: its first tokens (admission, prefill, the first step) and its decoding "
        "after them:",
        "",
        "| config | first tokens, ms a request | decode tok/s after them | x plain |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {r['name']} | {r['first_ms1']:.1f} | {r['decode1']:.1f} | {r['decode1'] / plain['decode1']:.2f} |"
        for r in rows
    ]
    served = {kind: next((r for r in rows if r["name"] == name), None) for kind, name in SERVED.items()}
    if None not in served.values():
        lines += [
            "",
            "DFLASH as served / plain as served, tokens/s: "
            + "; ".join(
                f"{c}: {served['dflash'][k] / served['plain'][k]:.2f}"
                for c, k in [("batch 1", "bs1"), ("batch 1 decoding", "decode1"), *((str(c), f"c{c}") for c in cs)]
            ),
        ]
    peak = bandwidth()
    lines += [
        "",
        f"MBU at batch 1 from its tokens/s (prompts' prefills and admissions included; the weights a step reads, "
        f"{rows[0]['weight_bytes'] / 1e9:.2f} GB, over the datasheet's "
        f"{'-' if peak is None else f'{peak / 1e12:.2f} TB/s'}): "
        + "; ".join(f"{r['name']} {mbu(r['weight_bytes'], r['bs1'])}" for r in rows if not r["accept"]),
    ]
    lines += [
        "",
        "Per-step breakdown (ms per decode step: a replay of k steps counts k, a DFLASH verify step one;"
        " separate runs that synchronise after each phase; memd between steps: what idle passes waited for memd,"
        " per step, in no step's time):",
        "",
        "| config | batch | step | forward | draft | sampling | memd | host | memd share | waited memd calls / 100 "
        "steps"
        " | memd between steps | MBU (bs 1) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        for c in (1, 16):
            b = r[f"breakdown{c}"]
            step_mbu = mbu(r["weight_bytes"], 1000 / b["step"]) if c == 1 and not r["accept"] else "-"
            lines.append(
                f"| {r['name']} | {c} | {b['step']:.2f} | {b['forward']:.2f} | {b['draft']:.2f} | "
                f"{b['sampling']:.2f} | {b['memd']:.3f} | {b['host']:.2f} | {b['memd'] / b['step']:.1%} | "
                f"{b['memd_calls_per_100_steps']:.1f} | {b['memd_idle']:.3f} | {step_mbu} |"
            )
    sampled = args.sampled_concurrency
    lines += [
        "",
        f"Sampled requests (temperature {SAMPLED_TEMPERATURE}, top-p {SAMPLED_TOP_P}, seeded), same run:",
        "",
        "| config | " + " | ".join(f"accept length, {c} | {c} concurrent tok/s | x plain" for c in sampled) + " |",
        "|---|" + "---|---|---|" * len(sampled),
    ]
    for r in rows:
        if f"sampled{sampled[0]}" in r:
            cells = [
                f"{'-' if r[f'sampled_accept{c}'] is None else format(r[f'sampled_accept{c}'], '.2f')} | "
                f"{r[f'sampled{c}']:.1f} | {r[f'sampled{c}'] / plain[f'sampled{c}']:.2f}"
                for c in sampled
            ]
            lines.append(f"| {r['name']} | " + " | ".join(cells) + " |")
    for spec in (r for r in rows if r["accept"] and r["always_speculates"]):  # against plain at as many steps a replay
        same = next(r for r in rows if r["graphs"] and not r["accept"] and r["steps"] == spec["steps"])
        for c in (1, 16):
            lines.append(
                f"\n{spec['name']}: DFLASH step / plain step at batch {c}: "
                f"{spec[f'breakdown{c}']['step'] / same[f'breakdown{c}']['step']:.2f}"
            )
    return "\n".join(lines)


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """--target, --load-format and --draft, as the engine benchmarks take them."""
    p.add_argument("--target", help="HF folder (default: the project's SmolLM2-135M-Instruct)")
    p.add_argument("--load-format", choices=["auto", "dummy"], default="auto")
    p.add_argument(
        "--draft",
        default=str(pathlib.Path(__file__).parents[1] / "modeld" / "default_draft"),
        help="z-lab format draft, or 'none'",
    )


def add_run_arguments(
    p: argparse.ArgumentParser, *, batch1: int, concurrency: str, sampled_concurrency: str, rounds: int
) -> None:
    """What run_variant and memd_args read of the command line (defaults per benchmark): the requests' length, the
    runs' batches, memd's page and draft pool."""
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument(
        "--ignore-eos",
        action="store_true",
        help="every request decodes --new-tokens (always so with dummy weights): batch-1 runs of real "
        "weights otherwise end at EOS after answers of varied length, whose prefills and admissions "
        "move tokens/s by more than a kernel-level change",
    )
    p.add_argument("--batch1", type=int, default=batch1, help="prompts answered one at a time")
    p.add_argument("--concurrency", default=concurrency)
    p.add_argument(
        "--sampled-concurrency", default=sampled_concurrency, help="concurrencies of the sampled requests' runs"
    )
    p.add_argument("--rounds", type=int, default=rounds, help="batches per concurrency above 1, each timed and summed")
    p.add_argument("--page", type=int, default=16)
    p.add_argument("--ratio", type=float, default=0.25)
    p.add_argument("--window", type=int, default=256)


def resolve_run_arguments(args) -> bool:
    """The concurrencies as lists of ints and the target's folder (the default model, fetched if need be), in place;
    returns whether every request ignores EOS (asked, or dummy weights)."""
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.sampled_concurrency = [int(c) for c in args.sampled_concurrency.split(",")]
    args.target = args.target or str(ensure_default_model())
    return args.load_format == "dummy" or args.ignore_eos


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.engine_speed", description=__doc__.splitlines()[0])
    add_model_arguments(p)
    add_run_arguments(p, batch1=4, concurrency="16,64", sampled_concurrency="1,16", rounds=3)
    p.add_argument("--skip-hf", action="store_true")
    p.add_argument(
        "--variants",
        help="comma-separated indexes into VARIANTS to run (default: all; 1, the ratios' "
        "reference, always runs): " + "; ".join(f"{i}: {v.name}" for i, v in enumerate(VARIANTS)),
    )
    p.add_argument("--json", help="write the rows here too")
    args = p.parse_args(argv)
    ignore_eos = resolve_run_arguments(args)
    draft = None if args.draft == "none" else args.draft
    prompts = prompts_for(args.target, args.load_format, largest_batch(args))
    hf = None if args.skip_hf else hf_generate(args, prompts, ignore_eos=ignore_eos)
    rows = []
    with memd_process(*memd_args(args.target, draft, args)) as memd:
        chosen = set(range(len(VARIANTS))) if args.variants is None else {1, *map(int, args.variants.split(","))}
        for i, v in enumerate(VARIANTS):
            if (v.dflash and draft is None) or i not in chosen:
                continue
            rows.append(run_variant(v, memd, args, prompts, ignore_eos=ignore_eos))
            print(json.dumps(rows[-1]), flush=True)
    text = report(rows, hf, args)
    print(text)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"hf": hf, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
