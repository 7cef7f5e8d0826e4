"""Constrained DFLASH against unconstrained DFLASH at batch 1, in one run: tokens/s of each in alternating pairs, the
accept length of each, and the grammar's host cost per step (the runner's "mask" phase: a constrained step's masks
built on the host, along the drafts of a verify block).

    python -m bench.engine.constrained_speed [--device cuda|cpu] [--pairs 3] [--target DIR] [--draft DIR]

Each pair runs one request constrained by a JSON schema (a list of up to 16 records, so the answer is long), then the
same prompt unconstrained for as many tokens as the constrained answer had (EOS ignored): the two rows decode the
same number of tokens from the same prompt. Their texts differ (the unconstrained answer is the model's own, which
the draft predicts differently): the accept lengths, printed beside the ratio, tell how much of the ratio is that. The
grammar's own cost is the mask column, against the constrained step's wall time. The engine (DFLASH as served, but
verifying at every step: the speculation policy off, so that both rows are DFLASH's wherever the policy would decode
plainly, the CPU included) is built once, against a memd child process with the draft's bounded pool; a warm-up pair
runs first, unmeasured."""

import argparse
import json
import statistics
import sys
import time

from bench.common.engine_hooks import PhaseTimer, SwitchableHooks
from bench.common.memd_process import memd_process
from bench.common.rows import device_name
from modeld.config import ModeldConfig
from modeld.engine.build import build_engine
from modeld.engine.tuning import Tuning
from modeld.model.fetch_default import ensure_default_model
from modeld.request import Request
from modeld.sampling_params import Constraint, SamplingParams

DEFAULT_DRAFT = "modeld/default_draft"
RECORDS = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 24},
            "city": {"type": "string", "maxLength": 24},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
        },
        "required": ["name", "city", "age"],
        "additionalProperties": False,
    },
    "minItems": 16,
    "maxItems": 16,
}
QUESTION = "List sixteen people as JSON records with their name, city and age."


class MaskTimer(PhaseTimer):
    """Seconds in the "mask" phase and the engine steps ("run" phases) seen while attached."""

    def __init__(self):
        super().__init__()
        self.mask_seconds, self.steps = 0.0, 0

    def timed(self, phase: str, seconds: float) -> None:
        if phase == "mask":
            self.mask_seconds += seconds
        elif phase == "run":
            self.steps += 1


def run_one(engine, hooks: SwitchableHooks, prompt: list[int], params: SamplingParams, rid: str) -> dict:
    """One request alone, the engine thread serving it: its tokens, seconds, verify steps and mask time per step."""
    timer = MaskTimer()
    hooks.attach(timer)
    req = Request(rid=rid, prompt_ids=list(prompt), params=params, stream=False)
    begin = time.perf_counter()
    assert engine.submit(req)
    while req.events.get(timeout=600)[0] != "complete":
        pass
    seconds = time.perf_counter() - begin
    hooks.detach()
    assert req.finish.reason != "abort", req.finish
    return dict(
        tokens=len(req.output_ids),
        seconds=seconds,
        accept=req.accept_length(),
        mask_ms=1e3 * timer.mask_seconds / max(timer.steps, 1),
        steps=timer.steps,
        text=engine.output.tokenizer.decode(req.output_ids, skip_special_tokens=True),
    )


def run_pair(engine, hooks, prompt: list[int], tag: str) -> tuple[dict, dict]:
    constrained = run_one(
        engine,
        hooks,
        prompt,
        SamplingParams(max_new_tokens=1024, temperature=0, constraint=Constraint("json_schema", json.dumps(RECORDS))),
        f"{tag}-constrained",
    )
    json.loads(constrained["text"])  # the constrained answer is whole JSON
    free = SamplingParams(max_new_tokens=constrained["tokens"], temperature=0, ignore_eos=True)
    return constrained, run_one(engine, hooks, prompt, free, f"{tag}-free")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.engine.constrained_speed", description=__doc__.splitlines()[0])
    p.add_argument("--target", help="default: the converted default model")
    p.add_argument("--draft", default=DEFAULT_DRAFT)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--pairs", type=int, default=3)
    args = p.parse_args(argv)
    args.target = args.target or str(ensure_default_model())
    dtype = "bfloat16" if args.device == "cuda" else "float32"
    memd_args = ["--device", args.device, "--target-model", args.target, "--page-size", "16"]
    memd_args += ["--max-running-requests", "4", "--max-total-tokens", "32768", "--kv-cache-dtype", dtype]
    memd_args += ["--draft-model", args.draft, "--draft-kv-ratio", "0.25", "--draft-window", "256"]
    hooks = SwitchableHooks()
    with memd_process(*memd_args) as memd:
        cfg = ModeldConfig(
            device=args.device,
            memd=memd,
            target_model=args.target,
            draft_model=args.draft,
            speculative_algorithm="dflash",
            tuning=Tuning(adaptive_speculation=False),
        )
        built = build_engine(cfg, lambda serving: None, hooks=hooks)
        engine = built.engine
        prompt = engine.output.tokenizer.apply_chat_template(
            [{"role": "user", "content": QUESTION}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        engine.start()
        try:
            run_pair(engine, hooks, prompt, "warm")
            pairs = [run_pair(engine, hooks, prompt, f"pair{i}") for i in range(args.pairs)]
        finally:
            engine.stop()
            built.link.close()
    print(f"## Constrained DFLASH against unconstrained DFLASH, batch 1, greedy ({device_name(args.device)})\n")
    print(
        "| pair | tokens | constrained tok/s | unconstrained tok/s | ratio | accept c / u | step ms c | mask ms/step |"
    )
    print("|---|---|---|---|---|---|---|---|")
    ratios = []
    for i, (c, u) in enumerate(pairs):
        rate_c, rate_u = c["tokens"] / c["seconds"], u["tokens"] / u["seconds"]
        ratios.append(rate_c / rate_u)
        print(
            f"| {i} | {c['tokens']} | {rate_c:.1f} | {rate_u:.1f} | {ratios[-1]:.3f} | "
            f"{c['accept']:.2f} / {u['accept']:.2f} | {1e3 * c['seconds'] / c['steps']:.2f} | {c['mask_ms']:.3f} |"
        )
    print(f"\nmedian ratio {statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
