"""A training run's loss curve as a PNG, from the JSON log train.train_draft and train.fit_budget write (--log-json):
every step's loss, faint, and its mean over a window of steps.

    python -m train.loss_curve LOG.json OUT.png [--window 50] [--title TEXT]

Needs matplotlib (`pip install -e .[plots]`); nothing else in the project does.
"""

import argparse
import json
import pathlib
import sys

import numpy as np


def moving_mean(values: np.ndarray, window: int) -> np.ndarray:
    """The mean of each run of `window` values (shorter at the start)."""
    sums = np.cumsum(np.concatenate([[0.0], values]))
    ends = np.arange(1, len(values) + 1)
    starts = np.maximum(0, ends - window)
    return (sums[ends] - sums[starts]) / (ends - starts)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m train.loss_curve", description=__doc__.splitlines()[0])
    p.add_argument("log")
    p.add_argument("out")
    p.add_argument("--window", type=int, default=50)
    p.add_argument("--title", default="")
    args = p.parse_args(argv)
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot
    except ImportError:
        sys.exit("train.loss_curve needs matplotlib: pip install -e .[plots]")
    log = json.loads(pathlib.Path(args.log).read_text())
    losses = np.asarray(log["losses"], dtype=np.float64)
    steps = np.arange(1, len(losses) + 1)
    figure, axes = pyplot.subplots(figsize=(8, 4.5), dpi=100)
    axes.plot(steps, losses, color="tab:blue", alpha=0.25, linewidth=0.6, label="each step")
    axes.plot(
        steps, moving_mean(losses, args.window), color="tab:blue", linewidth=2, label=f"mean of {args.window} steps"
    )
    axes.set_xlabel("step")
    axes.set_ylabel("weighted block cross-entropy")
    axes.set_title(args.title or pathlib.Path(args.log).stem)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
