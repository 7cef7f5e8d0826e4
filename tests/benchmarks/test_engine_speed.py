"""bench.engine.speed's command line and report (the runs themselves need a GPU): every command the project gives
for it parses into rows, and the report's ratios are against plain as served."""

import argparse
import pathlib
import re
import shlex

import pytest

from bench.common.rows import row_config
from bench.engine.speed import parse_args
from bench.engine.speed_report import report

ROOT = pathlib.Path(__file__).parents[2]
REDIRECTS = (">", "2>", "||")


def device_check_commands() -> list[str]:
    """The arguments of every bench.engine.speed call in dev/draft-session/device-check.sh."""
    script = (ROOT / "dev" / "draft-session" / "device-check.sh").read_text().replace("\\\n", " ")
    calls = re.findall(r"python3 -m bench\.engine\.speed (.*)", script)
    return [" ".join(_until_redirect(shlex.split(call))) for call in calls]


def _until_redirect(words: list[str]) -> list[str]:
    return words[: next((i for i, w in enumerate(words) if w.startswith(REDIRECTS)), len(words))]


def benchmarks_commands() -> list[str]:
    """The arguments of every bench.engine.speed command in BENCHMARKS.md's sections above its history."""
    text = (ROOT / "BENCHMARKS.md").read_text().split("## New measurements")[0]
    return re.findall(r"python -m bench\.engine\.speed ([^`]*)`", text)


@pytest.mark.parametrize("command", device_check_commands() + benchmarks_commands())
def test_every_given_command_parses_into_rows_that_make_modeld_configs(command):
    args = parse_args(shlex.split(command))
    assert args.rows
    for row in args.rows:
        cfg = row_config(row, "127.0.0.1:5555", "target", args.load_format, args.draft)
        assert cfg.speculative_algorithm == ("dflash" if row.kind == "dflash" else "none")


def test_the_device_check_speed_set_runs_the_ablations_it_names():
    speed = next(c for c in device_check_commands() if "--concurrency 16,64 --batch1 3 --ablate overlap" in c)
    assert [r.name for r in parse_args(shlex.split(speed)).rows] == [
        "plain as served",
        "plain as served, overlap_decode=false",
        "plain as served, norm_fusion=false",
        "plain as served, alone_prompt_tokens=0",
        "plain as served, several_steps_from_batch=1",
        "DFLASH as served",
        "DFLASH as served, overlap_decode=false",
        "DFLASH as served, norm_fusion=false",
        "DFLASH as served, alone_prompt_tokens=0",
        "DFLASH as served, several_cycles_from_batch=16",
        "DFLASH as served, adaptive_speculation=false",
    ]


ARGS = argparse.Namespace(
    concurrency=[16], sampled_concurrency=[16], target="t", load_format="dummy", new_tokens=8, ignore_eos=True, page=16
)


def measured(name: str, kind: str, rate: float, step_ms: float, always_speculates=False) -> dict:
    breakdown = dict.fromkeys(("forward", "draft", "sampling", "memd", "host", "memd_calls_per_100_steps"), 0.1)
    return {
        "name": name,
        "kind": kind,
        "graphs": True,
        "steps": 4,
        "always_speculates": always_speculates,
        "bs1": rate,
        "first_ms1": 3.0,
        "decode1": rate,
        "accept": 1.5 if kind == "dflash" else None,
        "c16": 10 * rate,
        "sampled16": 8 * rate,
        "sampled_accept16": None,
        "breakdown1": {**breakdown, "step": step_ms, "memd_idle": 0.0},
        "breakdown16": {**breakdown, "step": 2 * step_ms, "memd_idle": 0.0},
        "weight_bytes": 10**8,
    }


def test_ratios_are_against_plain_as_served():
    rows = [
        measured("plain as served", "plain", 1000, 1.0),
        measured("DFLASH as served", "dflash", 1200, 1.2),
        measured("DFLASH as served, speculative_disable_by_batch_size=0", "dflash", 1100, 1.5, always_speculates=True),
    ]
    text = report(rows, 50.0, ARGS, "NVIDIA H100 80GB HBM3")
    assert "| DFLASH as served | 1.50 | 1200.0 | 24.00 | 1.20 | 12000.0 | 1.20 |" in text
    assert "DFLASH as served / plain as served, tokens/s: batch 1: 1.20" in text
    assert "DFLASH step / plain step (plain as served) at batch 1: 1.50" in text


def test_without_plain_as_served_a_ratio_is_a_dash():
    text = report([measured("DFLASH as served", "dflash", 1200, 1.2)], None, ARGS, "a card not in BANDWIDTH")
    assert "| DFLASH as served | 1.50 | 1200.0 | - | - | 12000.0 | - |" in text
