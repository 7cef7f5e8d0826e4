"""How many answers and answer tokens a response folder holds.

    python -m train.stats DIR [DIR ...]
"""

import pathlib
import sys

from train import responses


def count(folder: pathlib.Path) -> tuple[int, int]:
    """(records, answer tokens) of every shard in `folder`."""
    records = tokens = 0
    for path in responses.shard_paths(folder):
        for _, answers in responses.read_shard(path):
            records += 1
            tokens += sum(len(a) for a in answers)
    return records, tokens


def main(argv=None) -> int:
    for folder in (argv if argv is not None else sys.argv[1:]):
        records, tokens = count(pathlib.Path(folder))
        print(f"{folder}: {records} answers, {tokens} answer tokens ({tokens / max(1, records):.0f} per answer)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
