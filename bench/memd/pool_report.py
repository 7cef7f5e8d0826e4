"""bench.memd.pool_payoff's report: the pools, the fits, the long-context workload and the chat at every ratio, in
markdown tables that say which figures are measured and which are the formula's."""

from bench.common.rows import device_name
from bench.memd.pool_runs import Fit, Probe, RatioRun, greedy_equal
from bench.memd.pool_sizes import PoolFigures


def gain(value: float, base: float) -> str:
    return f"{value / base - 1:+.1%}"


def figure_sources(run: RatioRun) -> list[tuple[str, PoolFigures | None]]:
    return [("memd Capacity (measured)", run.capacity), ("memd log (measured)", run.logged), ("formula", run.formula)]


def pool_row(ratio: float, source: str, figures: PoolFigures | None, base: PoolFigures | None) -> str:
    """One source's figures at a ratio, the target's tokens against the same source's at the first ratio."""
    if figures is None:
        return f"| {ratio:g} | {source}: no sizing lines | | | | | | |"
    versus = gain(figures.target_tokens, base.target_tokens) if base else "-"
    return (
        f"| {ratio:g} | {source} | {figures.target_tokens:,} | {figures.target_bytes:,} | "
        f"{figures.draft_tokens:,} | {figures.draft_bytes:,} | {figures.request_cap:,} | {versus} |"
    )


def pools_table(runs: list[RatioRun]) -> str:
    base = dict(figure_sources(runs[0]))
    return "\n".join(
        [
            "| ratio | figure | target tokens | target bytes | draft tokens | draft bytes | request cap | "
            f"target tokens vs ratio {runs[0].ratio:g} |",
            "|---|---|---|---|---|---|---|---|",
            *(pool_row(run.ratio, source, f, base[source]) for run in runs for source, f in figure_sources(run)),
        ]
    )


def probe_text(p: Probe) -> str:
    failures = f", {p.failed} failed" if p.failed else ""
    return (
        f"{p.requests}: {p.preemptions} preempted{failures}, {p.peak_running} ran at once, "
        f"{p.peak_tokens:,} KV tokens at most"
    )


def measured_text(fit: Fit) -> str:
    """The measured count, or what the runs showed instead: more fit, or fewer."""
    if fit.measured is not None:
        return str(fit.measured)
    if not fit.probes[0].fit:
        return f"< {fit.formula}"
    return f">= {fit.formula + 1}"


def fit_row(fit: Fit, ratio: float) -> str:
    if fit.formula is None:
        return f"| {fit.context:,} | {ratio:g} | - | - | longer than memd's context length |"
    runs = [probe_text(p) for p in fit.probes] + (
        [f"{fit.formula + 1}: past the rows"] if fit.formula == fit.rows else []
    )
    cap = " (the rows)" if fit.pool_holds > fit.rows else ""
    return f"| {fit.context:,} | {ratio:g} | {fit.formula}{cap} | {measured_text(fit)} | {'; '.join(runs)} |"


def fits_table(runs: list[RatioRun], args) -> str:
    return "\n".join(
        [
            f"| context | ratio | most at once, formula | most at once, measured | runs (requests: of "
            f"{args.fit_new_tokens} new tokens each) |",
            "|---|---|---|---|---|",
            *(fit_row(run.fits[i], run.ratio) for i in range(len(runs[0].fits)) for run in runs),
        ]
    )


def long_table(runs: list[RatioRun]) -> str:
    base = runs[0].long
    rows = [
        f"| {run.ratio:g} | {run.long.tokens / run.long.seconds:.1f} | "
        f"{gain(run.long.tokens / run.long.seconds, base.tokens / base.seconds)} | {run.long.seconds:.2f} | "
        f"{run.long.preemptions} | {len(run.long.errors)} |"
        for run in runs
    ]
    header = f"| ratio | tokens/s | vs ratio {runs[0].ratio:g} | seconds | preemptions | failed requests |"
    return "\n".join([header, "|---|---|---|---|---|---|", *rows])


def chat_table(runs: list[RatioRun], args) -> str:
    later = f"turns 2-{args.chat_turns}"
    rows = [
        f"| {run.ratio:g} | {run.chat.hit_rate:.1%} | {1000 * run.chat.later_ttft:.1f} | "
        f"{1000 * run.chat.first_ttft:.1f} | {run.chat.preemptions} | {len(run.chat.errors)} |"
        for run in runs
    ]
    header = (
        f"| ratio | prefix hit rate, {later} | mean time to first token, {later} (ms) | "
        "mean time to first token, first turns (ms) | preemptions | failed requests |"
    )
    return "\n".join([header, "|---|---|---|---|---|---|", *rows])


def failures(runs: list[RatioRun], workload: str) -> list[str]:
    """A line for each error of a workload's failed requests at each ratio, with how many failed so."""
    lines = []
    for run in runs:
        errors_here = getattr(run, workload).errors
        lines += [f"- ratio {run.ratio:g}: {errors_here.count(e)} failed with {e}" for e in dict.fromkeys(errors_here)]
    return lines


def header(args) -> str:
    chunk = args.chunked_prefill_size or "memd's default"
    return (
        f"{device_name(args.device)}; target {args.target} ({args.load_format}), draft {args.draft} (window "
        f"{args.draft_window}); KV budget {args.kv_budget_bytes:,} bytes, page {args.page_size}, "
        f"{args.max_running_requests} request rows, prefill chunk {chunk}.\n"
        "Measured: memd's Capacity and log, and the engine's runs on this device. Formula: memd.sizing for memd's "
        "inputs, and for the fits the formula's pool over each request's pages."
    )


def report(runs: list[RatioRun], args) -> str:
    parts = [header(args), "KV pools:", pools_table(runs)]
    if runs[0].fits:
        parts += ["Most requests of a context at once without preemption:", fits_table(runs, args)]
    parts += [
        f"Long-context workload (measured): {args.long_requests} requests of {args.long_prompt}-token prompts and "
        f"{args.long_new_tokens} new tokens, submitted at once:",
        "\n".join([long_table(runs), *failures(runs, "long")]),
    ]
    if runs[0].chat:
        parts += [
            f"Multi-turn chat (measured): {args.chat_conversations} conversations of {args.chat_turns} turns, "
            f"{args.chat_turn_tokens} new prompt tokens and {args.chat_new_tokens}-token answers a turn:",
            "\n".join([chat_table(runs, args), *failures(runs, "chat")]),
        ]
    parts.append(f"greedy outputs equal across ratios: {'yes' if greedy_equal(runs) else 'no'}")
    return "\n\n".join(parts)
