"""modeld's command line: DFLASH with the shipped draft is the default on CUDA for the default target (it beat plain
decoding on the H200: BENCHMARKS.md), and every flag that says otherwise keeps plain decoding."""

import pytest

from memd import defaults
from modeld.config import build_parser, config_from_args

ADDRESSES = ["--memd", "127.0.0.1:5555", "--listen", "127.0.0.1:5556"]
DRAFT = str(defaults.default_draft_dir())


def resolved(*flags: str) -> tuple[str | None, str]:
    cfg = config_from_args([*ADDRESSES, *flags])
    return cfg.draft_model, cfg.speculative_algorithm


def test_cuda_with_the_default_target_runs_the_shipped_draft():
    assert resolved("--device", "cuda") == (DRAFT, "dflash")
    assert resolved("--device", "cuda", "--speculative-algorithm", "dflash") == (DRAFT, "dflash")


@pytest.mark.parametrize(
    "flags",
    [
        ["--device", "cpu"],
        ["--device", "cuda", "--speculative-algorithm", "none"],
        ["--device", "cuda", "--target-model", "/models/other"],
        ["--device", "cuda", "--load-format", "dummy"],
    ],
    ids=["cpu", "turned-off", "another-target", "dummy-weights"],
)
def test_plain_decoding_otherwise(flags):
    assert resolved(*flags) == (None, "none")


def test_a_draft_by_name_or_path():
    assert resolved("--device", "cpu", "--draft-model", "default") == (DRAFT, "dflash")
    assert resolved("--device", "cuda", "--draft-model", "/drafts/mine") == ("/drafts/mine", "dflash")


def test_dflash_without_a_draft_off_cuda_is_refused():
    with pytest.raises(ValueError, match="needs --draft-model"):
        config_from_args([*ADDRESSES, "--device", "cpu", "--speculative-algorithm", "dflash"])


def test_stream_interval():
    assert config_from_args([*ADDRESSES, "--device", "cpu"]).stream_interval == 1
    assert config_from_args([*ADDRESSES, "--device", "cpu", "--stream-interval", "8"]).stream_interval == 8
    with pytest.raises(ValueError, match="--stream-interval must be >= 1"):
        config_from_args([*ADDRESSES, "--device", "cpu", "--stream-interval", "0"])


def test_speculation_off_from_a_batch_size():
    assert config_from_args([*ADDRESSES, "--device", "cpu"]).speculative_disable_by_batch_size == 0
    flags = [*ADDRESSES, "--device", "cpu", "--speculative-disable-by-batch-size"]
    assert config_from_args([*flags, "0"]).speculative_disable_by_batch_size == 0
    with pytest.raises(ValueError, match="must be >= 0"):
        config_from_args([*flags, "-1"])


def test_the_command_line_holds_user_flags_only():
    """Tuning knobs are MODELD_TUNING's (modeld.engine.tuning); the prefill chunk and the decode lookahead are
    memd's (modeld reads them from its layout): none of them is a flag of modeld's."""
    parser = build_parser()
    flags = [a for action in parser._actions for a in action.option_strings if a.startswith("--") and a != "--help"]
    assert len(flags) <= 17, flags
    for gone in ("--steps-per-replay", "--decode-lookahead", "--chunked-prefill-size", "--disable-norm-fusion"):
        with pytest.raises(SystemExit):
            config_from_args([*ADDRESSES, "--device", "cpu", gone, "1"])


def test_tuning_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("MODELD_TUNING", "steps_per_replay=1,overlap_decode=false")
    tuning = config_from_args([*ADDRESSES, "--device", "cuda"]).tuning
    assert (tuning.steps_per_replay, tuning.overlaps_decode("cuda")) == (1, False)
    monkeypatch.setenv("MODELD_TUNING", "steps_per_replay=0")
    with pytest.raises(ValueError, match="steps_per_replay must be >= 1"):
        config_from_args([*ADDRESSES, "--device", "cpu"])
