"""How many answers and answer tokens a response folder holds, how many of those tokens lie past the second period
of a repetition loop (train.loops: the trainer anchors no block there), and how many past the point where
generation now stops a looping answer (train.loops.stop_point: answers made before that rule).

    python -m train.stats DIR [DIR ...]
"""

import pathlib
import sys

from train import loops, responses
from train.train_draft import TrainConfig


def count(folder: pathlib.Path, loop_repeats: int = TrainConfig.loop_repeats) -> tuple[int, int, int, int]:
    """(records, answer tokens, tokens past `loop_repeats` periods of a loop, tokens past the generation's stop point)
    of every shard in `folder`."""
    records = tokens = looped = unmade = 0
    for path in responses.shard_paths(folder):
        for _, answers in responses.read_shard(path):
            records += 1
            tokens += sum(len(a) for a in answers)
            looped += sum(loops.looped_tokens(a, loop_repeats) for a in answers)
            unmade += sum(len(a) - (loops.stop_point(a) or len(a)) for a in answers)
    return records, tokens, looped, unmade


def main(argv=None) -> int:
    for folder in argv if argv is not None else sys.argv[1:]:
        records, tokens, looped, unmade = count(pathlib.Path(folder))
        print(
            f"{folder}: {records} answers, {tokens} answer tokens ({tokens / max(1, records):.0f} per answer; "
            f"{looped / max(1, tokens):.1%} past two periods of a repetition loop, {unmade / max(1, tokens):.1%} "
            "past where generation now stops one)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
