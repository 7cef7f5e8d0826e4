"""Repetition loops in answers (train.loops) and the trainer's anchors, which stop a few periods into one while
its labels run on."""

import numpy as np

from train.batches import anchor_positions, epoch_batches, label_mask, sample_anchors, valid_anchors
from train.loops import anchor_spans, ends_in_loop, looped_tokens, periodic_tail, stop_point
from train.train_draft import TrainConfig


def test_an_answer_without_a_loop_has_no_periodic_tail():
    assert periodic_tail(list(range(100))) == (100, 0)
    assert periodic_tail([]) == (0, 0)
    assert periodic_tail([5, 6, 5, 6, 7]) == (5, 0)  # the end breaks the pattern


def test_the_longest_periodic_tail_and_its_shortest_period():
    prefix = [1, 2, 3, 4, 5, 6, 7]
    assert periodic_tail(prefix + [8, 9, 10] * 5) == (7, 3)
    assert periodic_tail(prefix + [8, 9] * 10) == (7, 2)  # also periodic in 4, 6...: the shortest period
    assert periodic_tail(prefix + [3] * 12) == (7, 1)
    # The tail may start inside what looked like the prefix: [.., 9, 8, 9, 8, 9] is periodic from the first 9.
    assert periodic_tail([1, 9, 8, 9, 8, 9, 8, 9]) == (1, 2)


def test_two_copies_are_not_a_loop_and_long_periods_are_not_looked_for():
    assert periodic_tail([1, 2] + [7, 8, 9] * 2) == (8, 0)
    assert periodic_tail([7, 8, 9] * 3) == (0, 3)
    period = list(range(100, 170))  # 70 tokens: longer than MAX_PERIOD
    assert periodic_tail(period * 4) == (280, 0)
    assert periodic_tail(period * 4, max_period=80) == (0, 70)


def test_anchor_spans_cut_each_answer_a_few_periods_into_its_loop():
    loop = [50, 51, 52, 53]
    ids = np.array([0] * 10 + list(range(1, 21)) + loop * 8 + [0] * 5 + list(range(60, 90)))
    spans = [(10, 62), (67, 97)]  # the first answer ends in 8 copies of a 4-token period, the second has no loop
    assert anchor_spans(ids, spans, 2) == [(10, 30 + 2 * 4), (67, 97)]
    assert anchor_spans(ids, spans, 0) == spans
    assert looped_tokens(ids[10:62], 2) == 32 - 8
    assert looped_tokens(ids[67:97], 2) == 0


def test_the_trainer_anchors_up_to_the_cut_and_labels_past_it():
    loop = [50, 51, 52]
    seq = {"ids": np.array([0] * 8 + list(range(1, 41)) + loop * 20), "spans": [(8, 108)]}
    assert anchor_positions(seq, 2048, 0).tolist() == valid_anchors(108, seq["spans"], 2048).tolist()
    kept = anchor_positions(seq, 2048, 2)
    assert kept.tolist() == list(range(8, 48 + 2 * 3 - 1))  # a and a + 1 before the cut at 48 + 6
    drawn = sample_anchors(seq, 512, 2048, 0, 0, 0, loop_repeats=2)
    assert drawn.tolist() == kept.tolist()  # fewer positions than asked for: all of them, none in the copies
    assert label_mask(108, seq["spans"], 2048)[8:].all()  # the loss still labels every copy (block_loss's mask)
    tc = TrainConfig(anchors=512, batch_anchors=10_000, loop_repeats=2)
    batches = epoch_batches([seq, dict(seq)], tc, 0)
    assert sorted(i for b in batches for i in b) == [0, 1]


def test_generation_stops_four_periods_and_64_tokens_into_a_loop():
    text = list(range(1, 31))
    assert stop_point(text + [7, 8] * 31) is None and not ends_in_loop(text + [7, 8] * 31)  # 62 tokens of loop
    assert stop_point(text + [7, 8] * 32) == 30 + 64 and ends_in_loop(text + [7, 8] * 32)
    period = list(range(40, 80))  # 40 tokens: four periods (160) before it stops
    assert stop_point(text + period * 3 + period[:39]) is None
    assert stop_point(text + period * 4) == 30 + 160
    assert stop_point(text) is None and stop_point([]) is None
