"""One row's speed (bench.common.rows), its engine built in this process against a memd for its kind: tokens/s at
batch 1 and at each concurrency, greedy and sampled, and (optionally) the per-step breakdown at batch 1 and 16; and
the command-line settings these runs read (bench.engine.speed, bench.engine.paired_speed)."""

import argparse
import gc

import torch

from bench.common.engine_hooks import SwitchableHooks
from bench.common.requests import SAMPLED_TEMPERATURE, generate_all
from bench.common.rows import Row, row_config
from bench.common.served_memd import MemdSettings
from bench.common.simulated_acceptance import SimulatedAcceptance, simulate
from bench.engine.step_breakdown import Breakdown
from modeld.engine.build import build_engine
from modeld.model.fetch_default import ensure_default_model


def add_run_arguments(
    p: argparse.ArgumentParser, *, batch1: int, concurrency: str, sampled_concurrency: str, rounds: int
) -> None:
    """What run_row and memd_settings read of the command line (defaults per benchmark): the requests' length, the
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
    p.add_argument("--ratio", type=float, default=0.25, help="memd's draft pool for DFLASH rows: --draft-kv-ratio")
    p.add_argument("--window", type=int, default=256, help="memd's draft pool for DFLASH rows: --draft-window")


def resolve_run_arguments(args) -> bool:
    """The concurrencies as lists of ints and the target's folder (the default model, fetched if need be), in place;
    returns whether every request ignores EOS (asked, or dummy weights)."""
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.sampled_concurrency = [int(c) for c in args.sampled_concurrency.split(",")]
    args.target = args.target or str(ensure_default_model())
    return args.load_format == "dummy" or args.ignore_eos


def largest_batch(args) -> int:
    """The largest batch of any run (greedy or sampled): memd's running requests, the prompts a run needs."""
    return max(args.concurrency + args.sampled_concurrency)


def memd_settings(args) -> MemdSettings:
    draft = None if args.draft == "none" else args.draft
    return MemdSettings(args.target, draft, args.page, largest_batch(args), args.ratio, args.window, args.device)


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


def weight_bytes(model) -> int:
    """Bytes a decode step reads: every weight once (the embedding table only if it is not also the LM head)."""
    embed = model.model.embed_tokens.weight
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    return total - (0 if model.lm_head.weight is embed else embed.numel() * embed.element_size())


def run_row(row: Row, memd: str, args, prompts, ignore_eos: bool, breakdown: bool = True) -> dict:
    """One row's tokens/s (and, with `breakdown`, its per-step breakdown at batch 1 and 16); `memd` serves its kind."""
    cfg = row_config(row, memd, args.target, args.load_format, args.draft, args.device)
    hooks = SwitchableHooks()  # the breakdown observes some runs of the engine through them
    built = build_engine(cfg, lambda serving: None, hooks=hooks)
    engine = built.engine
    if row.simulated_accept is not None:
        simulate(engine, SimulatedAcceptance.with_mean(row.simulated_accept, engine.runner.spec.block))
    engine.start()
    try:
        generate_all(engine, prompts[:2], 8, True, "warm")
        graphs = cfg.device == "cuda" and not cfg.disable_cuda_graph
        measured = {
            "name": row.name,
            "kind": row.kind,
            "graphs": graphs,
            "steps": cfg.tuning.steps_per_replay,
            "always_speculates": row.kind == "dflash"
            and not cfg.speculative_disable_by_batch_size
            and not cfg.tuning.adaptive_speculation,
        }
        firsts = []
        tokens, seconds, verifies = run_batches(engine, 1, prompts, args, ignore_eos, "b1", first_tokens=firsts)
        measured["bs1"] = tokens / seconds
        # one request at a time: its first tokens (admission, prefill, the first step), then its decoding
        measured["first_ms1"] = 1000 * sum(t for t, _ in firsts) / len(firsts)
        measured["decode1"] = (tokens - sum(n for _, n in firsts)) / (seconds - sum(t for t, _ in firsts))
        measured["accept"] = tokens / verifies if verifies else None
        for c in args.concurrency:
            tokens, seconds, _ = run_batches(engine, c, prompts, args, ignore_eos, f"c{c}")
            measured[f"c{c}"] = tokens / seconds
        if graphs or cfg.device == "cpu":  # sampled requests: DFLASH's split path against plain decoding
            for c in args.sampled_concurrency:
                tokens, seconds, verifies = run_batches(
                    engine, c, prompts, args, ignore_eos, f"t{c}", SAMPLED_TEMPERATURE
                )
                measured[f"sampled{c}"] = tokens / seconds
                measured[f"sampled_accept{c}"] = tokens / verifies if verifies else None
        for c in (1, 16) if breakdown else ():
            prof = Breakdown(hooks)
            run_batches(engine, c, prompts, args, ignore_eos, f"prof{c}")
            measured[f"breakdown{c}"] = prof.close()
        measured["weight_bytes"] = weight_bytes(engine.runner.model)
        return measured
    finally:
        engine.stop()
        built.link.close()
        del engine, built
        gc.collect()  # the engine's parts refer to each other (memd's rebinders): free the model now
        torch.cuda.empty_cache()
