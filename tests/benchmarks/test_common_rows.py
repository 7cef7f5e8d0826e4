"""bench.common.rows: the as-served rows run modeld's defaults on CUDA, and --ablate makes valid configurations of
them or refuses with a usage error (the benchmarks themselves need a GPU: a row modeld's config refuses would fail
there only, after the machine's set-up)."""

import argparse
from dataclasses import replace

import pytest

from bench.common.rows import Row, add_model_arguments, add_row_arguments, parse_ablation, row_config, rows_from_args
from memd import defaults
from modeld.config import config_from_args
from modeld.engine.tuning import Tuning

MEMD = "127.0.0.1:5555"
DRAFT = str(defaults.default_draft_dir())


def rows(*argv: str, default_ablations: tuple[str, ...] = ()) -> list[Row]:
    p = argparse.ArgumentParser()
    add_model_arguments(p)
    add_row_arguments(p, default_ablations)
    return rows_from_args(p, p.parse_args(argv))


@pytest.mark.parametrize("kind, flags", [("plain", ["--speculative-algorithm", "none"]), ("dflash", [])])
def test_a_served_row_is_what_modelds_command_line_runs_on_cuda(kind, flags, monkeypatch):
    monkeypatch.delenv("MODELD_TUNING", raising=False)
    served = config_from_args(["--device", "cuda", "--memd", MEMD, "--listen", "127.0.0.1:5556", *flags])
    cfg = row_config(Row(kind), MEMD, served.target_model, "auto", DRAFT)
    assert cfg == replace(served, listen="")


def test_an_ablation_changes_its_tuning_fields_and_nothing_else():
    ablation = parse_ablation("skinny_linear=false, norm_fusion=false")
    assert ablation.kind is None and ablation.flags == ()
    assert ablation.tuning == Tuning(skinny_linear=False, norm_fusion=False)
    cfg = row_config(Row("plain", ablation), MEMD, "target", "dummy", None)
    assert cfg == replace(row_config(Row("plain"), MEMD, "target", "dummy", None), tuning=ablation.tuning)


def test_an_ablation_of_modelds_flags():
    ablation = parse_ablation("dflash:speculative_disable_by_batch_size=0,adaptive_speculation=false")
    assert ablation.kind == "dflash"
    cfg = row_config(Row("dflash", ablation), MEMD, "target", "dummy", "draft")
    assert cfg.speculative_disable_by_batch_size == 0 and cfg.tuning == Tuning(adaptive_speculation=False)
    eager = row_config(Row("plain", parse_ablation("disable_cuda_graph=true")), MEMD, "target", "dummy", None)
    assert eager.disable_cuda_graph and eager.tuning == Tuning()


@pytest.mark.parametrize(
    "text, message",
    [
        ("steps=4", "is not KEY=VALUE with a KEY of modeld's Tuning (skinny_linear, "),
        ("steps_per_replay", "is not KEY=VALUE"),
        ("eager:steps_per_replay=1", "the kind before ':' must be one of plain, dflash"),
        ("dflash:", "changes nothing"),
        ("plain:adaptive_speculation=false", "changes DFLASH rows only: write dflash:adaptive_speculation=false"),
        ("steps_per_replay=0", "steps_per_replay must be >= 1"),
        ("skinny_linear=3", "skinny_linear takes"),
        ("disable_cuda_graph=1", "disable_cuda_graph takes bool"),
        ("speculative_disable_by_batch_size=none", "speculative_disable_by_batch_size takes int"),
    ],
)
def test_a_wrong_ablation_is_refused_saying_what_is_wrong(text, message):
    with pytest.raises(ValueError) as refused:
        parse_ablation(text)
    assert message in str(refused.value)


def test_the_command_line_refuses_an_unknown_field_before_anything_runs(capsys):
    with pytest.raises(SystemExit) as exit_info:
        rows("--ablate", "steps_per_replay=0")
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --ablate: steps_per_replay must be >= 1" in err and "MODELD_TUNING" not in err


def test_rows_by_kind_each_as_served_then_its_ablations():
    names = [
        r.name
        for r in rows(
            "--ablate",
            "steps_per_replay=1",
            "--ablate",
            "speculative_disable_by_batch_size=0",
            "--ablate",
            "plain:several_steps_from_batch=1",
        )
    ]
    assert names == [
        "plain as served",
        "plain as served, steps_per_replay=1",
        "plain as served, several_steps_from_batch=1",
        "DFLASH as served",
        "DFLASH as served, steps_per_replay=1",
        "DFLASH as served, speculative_disable_by_batch_size=0",
    ]


def test_a_kind_named_in_an_ablation_runs_without_its_served_row():
    named = [
        r.name
        for r in rows("--rows", "plain", "--ablate", "overlap_decode=false", "--ablate", "dflash:steps_per_replay=1")
    ]
    assert named == ["plain as served", "plain as served, overlap_decode=false", "DFLASH as served, steps_per_replay=1"]


def test_without_a_draft_only_plain_rows():
    assert [r.name for r in rows("--draft", "none", default_ablations=("alone_prompt_tokens=0",))] == [
        "plain as served",
        "plain as served, alone_prompt_tokens=0",
    ]
    with pytest.raises(SystemExit):
        rows("--draft", "none", "--rows", "dflash")
    with pytest.raises(SystemExit):
        rows("--rows", "plain,eager")


def test_an_ablation_that_would_change_no_row_is_refused(capsys):
    with pytest.raises(SystemExit):
        rows("--rows", "plain", "--ablate", "speculative_disable_by_batch_size=0")
    assert "write dflash:speculative_disable_by_batch_size=0" in capsys.readouterr().err


def test_given_ablations_replace_the_default_ones():
    default = ("alone_prompt_tokens=0",)
    assert len(rows(default_ablations=default)) == 4
    assert [r.name for r in rows("--rows", "plain", "--ablate", "norm_fusion=false", default_ablations=default)] == [
        "plain as served",
        "plain as served, norm_fusion=false",
    ]
