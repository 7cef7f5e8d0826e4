"""bench.memd.pool_payoff's runs at one ratio, on an engine built in this process against that ratio's memd: the
fit runs (the most requests of a context at once), the long-context workload and the multi-turn chat."""

import gc
from dataclasses import dataclass, replace

import torch

from bench.common.engine_hooks import SwitchableHooks
from bench.common.in_process import running_engine
from bench.common.rows import Row, row_config
from bench.common.workloads import RunningPeak, errors, greedy_requests, random_prompts, release_all, run_requests
from bench.memd.pool_sizes import (
    PoolFigures,
    capacity_figures,
    context_limit,
    formula_figures,
    log_figures,
    memd_log,
    pool_holds,
)
from client.memd_admin import memd_capacity
from memd.geometry import read_config
from memd.sizing import PoolSizes


@dataclass(frozen=True)
class Probe:
    """One fit run: `requests` submitted at once."""

    requests: int
    preemptions: int
    peak_running: int  # the most of them running at once
    peak_tokens: int  # the most positions the running requests had computed at once
    failed: int

    @property
    def fit(self) -> bool:
        """They all ran at once, none preempted or failed."""
        return self.preemptions == 0 and self.failed == 0 and self.peak_running == self.requests


@dataclass(frozen=True)
class Fit:
    context: int
    pool_holds: int | None  # the formula's count for the target pool; None: longer than memd's context length
    rows: int  # memd's request rows: at most this many run
    probes: tuple[Probe, ...]  # the formula's count, then one more unless that is past the rows

    @property
    def formula(self) -> int | None:
        return None if self.pool_holds is None else min(self.pool_holds, self.rows)

    @property
    def measured(self) -> int | None:
        """The formula's count, when the runs confirm it (it fit; one more did not, or is past the rows)."""
        if not self.probes or not self.probes[0].fit:
            return None
        return self.formula if len(self.probes) == 1 or not self.probes[1].fit else None


def probe(engine, hooks: SwitchableHooks, count: int, context: int, args, vocab: int) -> Probe:
    """`count` requests of `context` tokens at once: how many ran at once, and whether any was preempted."""
    prompts = random_prompts(count, context - args.fit_new_tokens, vocab, f"fit {context} x{count}")
    reqs = greedy_requests(prompts, args.fit_new_tokens, f"fit{context}x{count}")
    peak, before = RunningPeak(engine.scheduler), engine.scheduler.preemptions
    hooks.attach(peak)
    try:
        run_requests(engine, reqs)
    finally:
        hooks.detach()
    return Probe(count, engine.scheduler.preemptions - before, peak.requests, peak.tokens, len(errors(reqs)))


def measure_fit(engine, hooks, context: int, sizes: PoolSizes, args, vocab: int) -> Fit:
    rows = args.max_running_requests
    if context > context_limit(args, sizes):
        return Fit(context, None, rows, ())
    fit = Fit(context, pool_holds(sizes.target_tokens, context, args.page_size), rows, ())
    counts = [fit.formula] + ([fit.formula + 1] if fit.formula < rows else [])
    return replace(fit, probes=tuple(probe(engine, hooks, n, context, args, vocab) for n in counts))


@dataclass(frozen=True)
class LongRun:
    tokens: int
    seconds: float
    preemptions: int
    errors: tuple[str, ...]  # of the requests that failed
    outputs: tuple[tuple[int, ...], ...]  # each request's output ids, in submission order


def run_long(engine, args, vocab: int) -> LongRun:
    prompts = random_prompts(args.long_requests, args.long_prompt, vocab, "long")
    reqs = greedy_requests(prompts, args.long_new_tokens, "long")
    before = engine.scheduler.preemptions
    seconds = run_requests(engine, reqs)
    outputs = tuple(tuple(r.output_ids) for r in reqs)
    preemptions = engine.scheduler.preemptions - before
    return LongRun(sum(map(len, outputs)), seconds, preemptions, tuple(errors(reqs)), outputs)


@dataclass(frozen=True)
class ChatRun:
    later_prompt_tokens: int  # of the turns after the first
    later_cached_tokens: int
    later_ttft: float  # mean seconds to the first token, turns after the first
    first_ttft: float  # the same, first turns
    preemptions: int
    errors: tuple[str, ...]  # of the requests that failed

    @property
    def hit_rate(self) -> float:
        return self.later_cached_tokens / self.later_prompt_tokens


def mean_ttft(reqs) -> float:
    """Mean seconds from submission to the first token, over the requests that produced one."""
    times = [r.first_token_at - r.arrived for r in reqs if r.first_token_at]
    return sum(times) / len(times) if times else float("nan")


def chat_turns(engine, args, vocab: int) -> list[list]:
    """Every conversation's turns, one turn of all of them at once: each prompt the last turn's prompt and answer
    and new user tokens."""
    turns = []
    for turn in range(args.chat_turns):
        user = random_prompts(args.chat_conversations, args.chat_turn_tokens, vocab, f"chat {turn}")
        history = [r.all_ids for r in turns[-1]] if turns else [[] for _ in user]
        reqs = greedy_requests([h + u for h, u in zip(history, user)], args.chat_new_tokens, f"chat{turn}")
        run_requests(engine, reqs)
        turns.append(reqs)
    return turns


def run_chat(engine, args, vocab: int) -> ChatRun:
    before = engine.scheduler.preemptions
    turns = chat_turns(engine, args, vocab)
    later = [r for turn in turns[1:] for r in turn]
    return ChatRun(
        later_prompt_tokens=sum(len(r.prompt_ids) for r in later),
        later_cached_tokens=sum(r.cached_tokens for r in later),
        later_ttft=mean_ttft(later),
        first_ttft=mean_ttft(turns[0]),
        preemptions=engine.scheduler.preemptions - before,
        errors=tuple(error for turn in turns for error in errors(turn)),
    )


@dataclass(frozen=True)
class RatioRun:
    ratio: float
    formula: PoolFigures
    capacity: PoolFigures
    logged: PoolFigures | None
    fits: tuple[Fit, ...]
    long: LongRun
    chat: ChatRun | None


def workloads(address: str, sizes: PoolSizes, args) -> tuple:
    """On an engine built against the memd at `address`: the fit runs, the long-context workload and the chat (if
    asked for), after a short warm-up run; then memd's pools wholly free, before the engine's session closes."""
    vocab = read_config(args.target)["vocab_size"]
    hooks = SwitchableHooks()
    cfg = row_config(Row("dflash"), address, args.target, args.load_format, args.draft, args.device)
    with running_engine(cfg, hooks) as engine:
        run_requests(engine, greedy_requests(random_prompts(2, 32, vocab, "warm"), 8, "warm"))
        fits = tuple(measure_fit(engine, hooks, c, sizes, args, vocab) for c in args.contexts)
        long = run_long(engine, args, vocab)
        chat = run_chat(engine, args, vocab) if args.chat_conversations else None
        release_all(address)
    return fits, long, chat


def measure_ratio(address: str, ratio: float, args) -> RatioRun:
    """One ratio against the memd at `address` (started with memd_flags for it): its pools, then the workloads."""
    capacity, logged = capacity_figures(memd_capacity(address)), log_figures(memd_log(address))
    fits, long, chat = workloads(address, args.sizes[ratio], args)
    gc.collect()  # the engine's parts refer to each other: free the model before the next ratio builds its own
    torch.cuda.empty_cache()
    return RatioRun(ratio, formula_figures(args.sizes[ratio]), capacity, logged, fits, long, chat)


def greedy_equal(runs: list[RatioRun]) -> bool:
    return all(run.long.outputs == runs[0].long.outputs for run in runs[1:])
