"""Two checkouts of this project measured against each other on one card, in one run: each checkout's paired
speed bench (plain and DFLASH as served, each run printing one JSON line with its kind and tokens/s) runs as a
child process in that checkout, in the order A, B, B, A, ... so that drift over the run falls on both alike. It
reports B over A for every kind and figure, per round and as the median and range: "does a refactor cost speed?"

    python dev/compare_checkouts.py --rounds 4 \\
        --a "old=../old:python -m bench.paired_speed --pairs 1" \\
        --b "new=.:python -m bench.engine.paired_speed --pairs 1"

A checkout's child runs with that checkout first on PYTHONPATH (before the rest of the caller's PYTHONPATH), so
its own modeld, memd and bench are the ones imported. Extra arguments after `--` go to both commands.
"""

import argparse
import json
import os
import pathlib
import shlex
import statistics
import subprocess
import sys

FIGURES = ("bs1", "c16", "sampled16")  # the paired benches' tokens/s keys at their default concurrencies


def parse_side(text: str) -> tuple[str, pathlib.Path, list[str]]:
    """NAME=DIR:COMMAND, as --a and --b take it."""
    name, _, rest = text.partition("=")
    folder, _, command = rest.partition(":")
    if not (name and folder and command):
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=DIR:COMMAND")
    path = pathlib.Path(folder).resolve()
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{folder!r} is not a folder")
    return name, path, shlex.split(command)


def run_side(folder: pathlib.Path, command: list[str], extra: list[str]) -> list[dict]:
    """One child run of a checkout's bench: the JSON lines it printed, each one measured run."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")])))
    done = subprocess.run(command + extra, cwd=folder, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{shlex.join(command)} in {folder} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    runs = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if not runs:
        sys.exit(f"{shlex.join(command)} in {folder} printed no JSON runs:\n{done.stdout[-3000:]}")
    return runs


def median_of(runs: list[dict], kind: str, figure: str) -> float | None:
    values = [r[figure] for r in runs if r.get("kind") == kind and r.get(figure)]
    return statistics.median(values) if values else None


def report(names: tuple[str, str], rounds: list[dict[str, list[dict]]]) -> str:
    """B over A per kind and figure: one ratio a round, their median and range."""
    a, b = names
    kinds = sorted({r["kind"] for side in rounds for runs in side.values() for r in runs})
    lines = [
        f"| {b} / {a}, tokens/s | " + " | ".join(f"round {i + 1}" for i in range(len(rounds))) + " | median | range |",
        "|---|" + "---|" * (len(rounds) + 2),
    ]
    for kind in kinds:
        for figure in FIGURES:
            pairs = [(median_of(r[a], kind, figure), median_of(r[b], kind, figure)) for r in rounds]
            ratios = [y / x for x, y in pairs if x and y]
            if ratios:
                cells = " | ".join(f"{r:.3f}" for r in ratios)
                lines.append(
                    f"| {kind} {figure} | {cells} | {statistics.median(ratios):.3f} "
                    f"| {min(ratios):.3f}-{max(ratios):.3f} |"
                )
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(prog="python dev/compare_checkouts.py", description=__doc__.splitlines()[0])
    p.add_argument("--a", type=parse_side, required=True, help="NAME=DIR:COMMAND, the reference")
    p.add_argument("--b", type=parse_side, required=True, help="NAME=DIR:COMMAND, measured against A")
    p.add_argument("--rounds", type=int, default=4, help="rounds of one run each, A first in odd rounds")
    args = p.parse_args(own)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    if args.a[0] == args.b[0]:
        p.error("--a and --b need different names")
    rounds = []
    for i in range(args.rounds):
        order = (args.a, args.b) if i % 2 == 0 else (args.b, args.a)
        measured = {}
        for name, folder, command in order:
            measured[name] = run_side(folder, command, extra)
            print(json.dumps({"round": i + 1, "side": name, "runs": measured[name]}), flush=True)
        rounds.append(measured)
    print(report((args.a[0], args.b[0]), rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
