"""Repetition loops in the target's answers. A greedy 135M target often ends an answer repeating one short stretch
("'Doe', 'Doe', 'Doe', ...", "1111...") until the token limit: in the first 73,642 answers, 38 % of the
answer tokens lie in tails that repeat a period of at most 64 tokens three times or more. Once a period has been
seen twice the rest of the tail is a copy, which a draft learns to predict early; anchors there spend a step's
blocks on nothing new. The trainer anchors only up to `repeats` periods into such a tail: the draft
still learns to enter a loop and to continue it (a block anchored in the second copy is labelled with the copies
after it), and the blocks go to the text before the loop.
"""

import numpy as np

MAX_PERIOD = 64  # the longest repeated stretch looked for, in tokens
MIN_REPEATS = 3  # a tail counts as a loop when it holds its period this many times
# Generation stops an answer whose tail has held its period this many times over at least this many tokens (a
# markdown rule or a short list may repeat a few tokens; a 135M model's loops run on to the token limit).
STOP_REPEATS, STOP_TOKENS = 4, 64


def periodic_tail(tokens, max_period: int = MAX_PERIOD, min_repeats: int = MIN_REPEATS) -> tuple[int, int]:
    """(start, period) of the longest tail of `tokens` made of one period of at most `max_period` tokens repeated at
    least `min_repeats` times (the shortest such period); (len(tokens), 0) when the answer does not end in a loop."""
    a = np.asarray(tokens)
    n = len(a)
    best = (n, 0)
    periods = np.arange(1, min(max_period, n // min_repeats) + 1)
    if not len(periods):
        return best
    # A tail periodic in p ends with a[n-1] == a[n-1-p]: only those periods are checked in full.
    for p in periods[a[n - 1 - periods] == a[n - 1]].tolist():
        differ = np.flatnonzero(a[:-p] != a[p:])  # i with a[i] != a[i + p]: the tail after the last one is periodic
        start = int(differ[-1]) + 1 if len(differ) else 0
        if n - start >= min_repeats * p and start < best[0]:
            best = (start, p)
    return best


def stop_point(tokens) -> int | None:
    """Where generation stops an answer that ends in a loop: STOP_REPEATS periods and at least STOP_TOKENS tokens
    into it (None when the answer does not get that far into one)."""
    start, period = periodic_tail(tokens)
    if not period or len(tokens) - start < max(STOP_REPEATS * period, STOP_TOKENS):
        return None
    return start + max(STOP_REPEATS * period, STOP_TOKENS)


def ends_in_loop(tokens) -> bool:
    """Whether an answer being generated has run far enough into a loop to stop it: the rest would be copies (26.9 %
    of the answer tokens of the first 73,642 answers lay past that point)."""
    return stop_point(tokens) is not None


def loop_cut(answer, repeats: int) -> int:
    """Where an answer's anchors end: `repeats` periods into the loop it ends in (its length without a loop)."""
    start, period = periodic_tail(answer)
    return min(len(answer), start + repeats * period) if period else len(answer)


def anchor_spans(ids, spans, repeats: int) -> list[tuple[int, int]]:
    """The answer spans [start, end) of a sequence cut `repeats` periods into the loop each ends in (a span
    without a loop, or every span when `repeats` is 0, stays whole)."""
    if not repeats:
        return [(int(s), int(e)) for s, e in spans]
    return [(int(s), int(s) + loop_cut(ids[s:e], repeats)) for s, e in spans]


def looped_tokens(answer, repeats: int) -> int:
    """Tokens of an answer past `repeats` periods of the loop it ends in (0 without a loop)."""
    return len(answer) - loop_cut(answer, repeats)
