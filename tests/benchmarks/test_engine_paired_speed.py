"""bench.engine.paired_speed's pairing and report (the runs themselves need a GPU)."""

import argparse

import pytest

from bench.engine.paired_speed import main, pair_ratios, report, run_order

ARGS = argparse.Namespace(concurrency=[16], sampled_concurrency=[16])


def run(kind: str, bs1: float, c16: float, sampled16: float, accept=None) -> dict:
    return {"kind": kind, "bs1": bs1, "c16": c16, "sampled16": sampled16, "accept": accept}


def test_each_pair_runs_both_and_the_first_alternates():
    assert run_order(3) == ["plain", "dflash", "dflash", "plain", "plain", "dflash"]


def test_a_pairs_ratio_is_dflash_over_plain_whichever_ran_first():
    runs = [
        run("plain", 100, 1000, 800),
        run("dflash", 120, 900, 800, 1.5),
        run("dflash", 110, 1100, 600, 1.6),
        run("plain", 100, 1000, 800),
    ]
    assert pair_ratios(runs, "bs1") == pytest.approx([1.2, 1.1])
    assert pair_ratios(runs, "c16") == pytest.approx([0.9, 1.1])
    assert pair_ratios(runs, "sampled16") == pytest.approx([1.0, 0.75])


def test_the_report_gives_every_pair_the_median_and_the_range():
    runs = [
        run("plain", 100, 1000, 800),
        run("dflash", 120, 900, 800, 1.5),
        run("dflash", 110, 1100, 600, 1.7),
        run("plain", 100, 1000, 800),
        run("plain", 100, 1000, 800),
        run("dflash", 130, 1050, 700, 1.6),
    ]
    text = report(runs, ARGS)
    assert "| 16 concurrent | 0.90 | 1.10 | 1.05 | 1.05 | 0.90-1.10 |" in text
    assert "| batch 1 | 1.20 | 1.10 | 1.30 | 1.20 | 1.10-1.30 |" in text
    assert "| 16 concurrent, sampled | 1.00 | 0.75 | 0.88 | 0.88 | 0.75-1.00 |" in text
    assert "| dflash as served | 120.0 | 1050.0 | 700.0 |" in text
    assert "accept length at batch 1: 1.60" in text


@pytest.mark.parametrize(
    "argv, message", [(["--pairs", "0"], "--pairs must be at least 1"), (["--draft", "none"], "needs a draft")]
)
def test_a_run_that_cannot_pair_is_refused_before_it_starts(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
