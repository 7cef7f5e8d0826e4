"""bench.engine.speed's tables in markdown, from its rows' measures (bench.engine.row_speed): tokens/s against HF and
against plain as served, first tokens, MBU, the per-step breakdown, the sampled runs, and a DFLASH step against a
plain one. A ratio to a row that did not run is "-"."""

import pathlib

from bench.common.requests import SAMPLED_TEMPERATURE, SAMPLED_TOP_P

# bytes/s, the datasheets' HBM figures by card name (an H200's device copy measured about 4.3e12); MBU is "-" on others
BANDWIDTH = {"H200": 4.8e12, "H100 80GB HBM3": 3.35e12, "H100 PCIe": 2.0e12}
PLAIN, DFLASH = "plain as served", "DFLASH as served"


def bandwidth(gpu: str) -> float | None:
    """The card's datasheet memory bandwidth (bytes/s), or None for a card not in BANDWIDTH."""
    return next((bw for key, bw in BANDWIDTH.items() if key in gpu), None)


def mbu(gpu: str, weight_bytes: int, steps_per_second: float) -> str:
    """Model bandwidth utilisation: the weights read per second over the card's bandwidth."""
    peak = bandwidth(gpu)
    return "-" if peak is None else f"{weight_bytes * steps_per_second / peak:.0%}"


def ratio(row: dict | None, reference: dict | None, key: str) -> str:
    return "-" if row is None or reference is None else f"{row[key] / reference[key]:.2f}"


def report(rows: list[dict], hf: float | None, args, gpu: str) -> str:
    named = {r["name"]: r for r in rows}
    plain = named.get(PLAIN)  # the ratios' reference
    cs = args.concurrency
    lines = [
        f"GPU: {gpu}; target {pathlib.Path(args.target).name} ({args.load_format}), "
        f"{args.new_tokens} new tokens{' every request (ignore_eos)' if args.ignore_eos else ''}, greedy, "
        f"page {args.page}; x plain: over {PLAIN}",
        "",
        "| config | accept length | batch 1 tok/s | x HF | x plain | "
        + " | ".join(f"{c} concurrent tok/s | x plain" for c in cs)
        + " |",
        "|---|---|---|---|---|" + "---|---|" * len(cs),
    ]
    if hf is not None:
        reference = "-" if plain is None else f"{hf / plain['bs1']:.2f}"
        lines.append(
            f"| HF generate (eager, bs 1) | - | {hf:.1f} | 1.00 | {reference} | "
            + " | ".join("- | -" for _ in cs)
            + " |"
        )
    for r in rows:
        accept = "-" if r["accept"] is None else f"{r['accept']:.2f}"
        xhf = f"{r['bs1'] / hf:.2f}" if hf else "-"
        lines.append(
            f"| {r['name']} | {accept} | {r['bs1']:.1f} | {xhf} | {ratio(r, plain, 'bs1')} | "
            + " | ".join(f"{r[f'c{c}']:.1f} | {ratio(r, plain, f'c{c}')}" for c in cs)
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
        f"| {r['name']} | {r['first_ms1']:.1f} | {r['decode1']:.1f} | {ratio(r, plain, 'decode1')} |" for r in rows
    ]
    if plain is not None and DFLASH in named:
        lines += [
            "",
            "DFLASH as served / plain as served, tokens/s: "
            + "; ".join(
                f"{c}: {ratio(named[DFLASH], plain, k)}"
                for c, k in [("batch 1", "bs1"), ("batch 1 decoding", "decode1"), *((str(c), f"c{c}") for c in cs)]
            ),
        ]
    peak = bandwidth(gpu)
    lines += [
        "",
        f"MBU at batch 1 from its tokens/s (prompts' prefills and admissions included; the weights a step reads, "
        f"{rows[0]['weight_bytes'] / 1e9:.2f} GB, over the datasheet's "
        f"{'-' if peak is None else f'{peak / 1e12:.2f} TB/s'}): "
        + "; ".join(f"{r['name']} {mbu(gpu, r['weight_bytes'], r['bs1'])}" for r in rows if not r["accept"]),
    ]
    lines += breakdown_table(rows, gpu)
    lines += sampled_table(rows, plain, args.sampled_concurrency)
    for spec in (r for r in rows if r["always_speculates"]):
        # against a plain row at as many steps a replay (plain as served first, if it has them)
        same = next((r for r in rows if r["kind"] == "plain" and r["graphs"] and r["steps"] == spec["steps"]), None)
        for c in (1, 16) if same else ():
            lines.append(
                f"\n{spec['name']}: DFLASH step / plain step ({same['name']}) at batch {c}: "
                f"{spec[f'breakdown{c}']['step'] / same[f'breakdown{c}']['step']:.2f}"
            )
    return "\n".join(lines)


def breakdown_table(rows: list[dict], gpu: str) -> list[str]:
    lines = [
        "",
        "Per-step breakdown (ms per decode step: a replay of k steps counts k, a DFLASH verify step one;"
        " separate runs that synchronise after each phase; memd between steps: what idle passes waited for memd,"
        " per step, in no step's time):",
        "",
        "| config | batch | step | forward | draft | sampling | memd | host | memd share | waited memd calls / 100 "
        "steps | memd between steps | MBU (bs 1) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        for c in (1, 16):
            b = r[f"breakdown{c}"]
            step_mbu = mbu(gpu, r["weight_bytes"], 1000 / b["step"]) if c == 1 and not r["accept"] else "-"
            lines.append(
                f"| {r['name']} | {c} | {b['step']:.2f} | {b['forward']:.2f} | {b['draft']:.2f} | "
                f"{b['sampling']:.2f} | {b['memd']:.3f} | {b['host']:.2f} | {b['memd'] / b['step']:.1%} | "
                f"{b['memd_calls_per_100_steps']:.1f} | {b['memd_idle']:.3f} | {step_mbu} |"
            )
    return lines


def sampled_table(rows: list[dict], plain: dict | None, sampled: list[int]) -> list[str]:
    lines = [
        "",
        f"Sampled requests (temperature {SAMPLED_TEMPERATURE}, top-p {SAMPLED_TOP_P}, seeded), same run:",
        "",
        "| config | " + " | ".join(f"accept length, {c} | {c} concurrent tok/s | x plain" for c in sampled) + " |",
        "|---|" + "---|---|---|" * len(sampled),
    ]
    for r in rows:
        if f"sampled{sampled[0]}" in r:  # rows with CUDA graphs
            cells = [
                f"{'-' if r[f'sampled_accept{c}'] is None else format(r[f'sampled_accept{c}'], '.2f')} | "
                f"{r[f'sampled{c}']:.1f} | {ratio(r, plain, f'sampled{c}')}"
                for c in sampled
            ]
            lines.append(f"| {r['name']} | " + " | ".join(cells) + " |")
    return lines
