"""Sizing a training schedule to a time budget: the anchors per sequence are the most that fit the blocks the
budget allows, and more epochs are taken only when every position already fits."""

import numpy as np
import pytest

from train.fit_budget import base_config, parse, pick_schedule
from train.train_draft import TrainConfig


def trained_blocks(counts: np.ndarray, anchors: int, epochs: int) -> int:
    return epochs * int(np.minimum(counts, anchors).sum())


@pytest.mark.parametrize("blocks", [7, 100, 1_000, 5_000, 12_345])
def test_the_anchors_are_the_most_that_fit(blocks):
    counts = np.random.default_rng(0).integers(0, 400, size=50)
    anchors, epochs = pick_schedule(counts, 2, blocks, min_anchors=1)
    assert epochs == 2
    assert trained_blocks(counts, anchors, epochs) <= blocks or anchors == 1
    assert anchors == counts.max() or trained_blocks(counts, anchors + 1, epochs) > blocks


def test_every_position_fits_then_more_epochs():
    counts = np.array([10, 20, 0, 30])
    assert pick_schedule(counts, 2, 60 * 5 + 7) == (30, 5)
    assert pick_schedule(counts, 2, 120) == (30, 2)


def test_fewer_epochs_before_fewer_anchors_than_the_floor():
    counts = np.full(100, 300)
    assert pick_schedule(counts, 2, 2 * 100 * 80, min_anchors=64) == (80, 2)  # 2 epochs leave 80 >= 64
    assert pick_schedule(counts, 2, 2 * 100 * 40, min_anchors=64) == (80, 1)  # 40 < 64: one epoch at 80
    assert pick_schedule(counts, 3, 100 * 30, min_anchors=64) == (30, 1)  # even one epoch is under: all in one
    assert pick_schedule(np.array([5, 10]), 2, 20, min_anchors=64) == (10, 1)  # the floor: at most the longest


def test_no_answers_is_an_error():
    with pytest.raises(ValueError, match="no sequence has an anchor"):
        pick_schedule(np.zeros(3, dtype=np.int64), 2, 100)


def test_the_fixed_settings_come_from_the_command_line():
    args = parse(
        [
            "--prompts",
            "P",
            "--responses",
            "R",
            "--out",
            "O",
            "--ckpt",
            "C",
            "--seconds",
            "60",
            "--layers",
            "4",
            "--lr",
            "3e-4",
            "--batch-anchors",
            "1024",
            "--loop-repeats",
            "0",
        ]
    )
    assert base_config(args) == TrainConfig(layers=4, lr=3e-4, batch_anchors=1024, loop_repeats=0)
    defaults = base_config(
        parse(["--prompts", "P", "--responses", "R", "--out", "O", "--ckpt", "C", "--seconds", "60"])
    )
    assert (defaults.layers, defaults.lr, defaults.batch_anchors, defaults.loop_repeats) == (5, 6e-4, 8192, 2)
