"""modeld's command line: DFLASH with the shipped draft is the default on CUDA for the default target (it beat plain
decoding on the H200: BENCHMARKS.md), and every flag that says otherwise keeps plain decoding."""

import pytest

from memd import defaults
from modeld.config import config_from_args

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


def test_steps_per_replay():
    assert config_from_args([*ADDRESSES, "--device", "cpu"]).steps_per_replay == 4
    assert config_from_args([*ADDRESSES, "--device", "cpu", "--steps-per-replay", "1"]).steps_per_replay == 1
    with pytest.raises(ValueError, match="--steps-per-replay must be >= 1"):
        config_from_args([*ADDRESSES, "--device", "cpu", "--steps-per-replay", "0"])


def test_stream_interval():
    assert config_from_args([*ADDRESSES, "--device", "cpu"]).stream_interval == 1
    assert config_from_args([*ADDRESSES, "--device", "cpu", "--stream-interval", "8"]).stream_interval == 8
    with pytest.raises(ValueError, match="--stream-interval must be >= 1"):
        config_from_args([*ADDRESSES, "--device", "cpu", "--stream-interval", "0"])


def test_speculation_off_from_a_batch_size():
    assert config_from_args([*ADDRESSES, "--device", "cpu"]).speculative_disable_by_batch_size == 16
    flags = [*ADDRESSES, "--device", "cpu", "--speculative-disable-by-batch-size"]
    assert config_from_args([*flags, "0"]).speculative_disable_by_batch_size == 0
    with pytest.raises(ValueError, match="must be >= 0"):
        config_from_args([*flags, "-1"])


@pytest.mark.parametrize(
    "flags,lookahead",
    [
        ([], 32),
        (["--speculative-algorithm", "dflash", "--draft-model", "default"], 96),  # four verify blocks a replay fit
        (["--speculative-algorithm", "dflash", "--draft-model", "default", "--decode-lookahead", "40"], 40),
        (["--decode-lookahead", "0"], 0),
    ],
)
def test_decode_lookahead_defaults_by_the_algorithm(flags, lookahead):
    assert config_from_args([*ADDRESSES, "--device", "cpu", *flags]).decode_lookahead == lookahead


def test_sampled_requests_speculate_alone_by_default():
    flags = [*ADDRESSES, "--device", "cpu"]
    assert config_from_args(flags).speculative_disable_sampled_by_batch_size == 2
    assert (
        config_from_args(
            [*flags, "--speculative-disable-sampled-by-batch-size", "4"]
        ).speculative_disable_sampled_by_batch_size
        == 4
    )
    with pytest.raises(ValueError, match="sampled-by-batch-size must be >= 0"):
        config_from_args([*flags, "--speculative-disable-sampled-by-batch-size", "-1"])


def test_decode_overlaps_on_cuda_unless_disabled():
    def overlaps(*flags: str) -> bool:
        return config_from_args([*ADDRESSES, *flags]).overlaps_decode

    assert overlaps("--device", "cuda")
    assert not overlaps("--device", "cuda", "--disable-overlap-decode")
    assert not overlaps("--device", "cpu")  # a step queued ahead would run before the last one streams


def test_alone_prompt_tokens_follows_the_graphs_by_default_and_is_bounded_by_the_largest_prompt_graph():
    flags = [*ADDRESSES, "--device", "cpu"]
    assert config_from_args(flags).alone_prompt_tokens is None  # the engine: 128 with CUDA graphs, else 0
    assert config_from_args([*flags, "--alone-prompt-tokens", "0"]).alone_prompt_tokens == 0
    assert config_from_args([*flags, "--alone-prompt-tokens", "128"]).alone_prompt_tokens == 128
    for bad in ("-1", "129"):
        with pytest.raises(ValueError, match=r"--alone-prompt-tokens must lie in \[0, 128\]"):
            config_from_args([*flags, "--alone-prompt-tokens", bad])
