"""The draft's training prompts: fetch, normalise, hold out, deduplicate, write compressed shards.

    python -m train.prompts build --out DIR [--cache .cache/train/downloads] [--seed 0] [--scale 1.0]
        [--only SRC,SRC] [--extra DIR] [--multi-turn 6000] [--shard-size 20000]
    python -m train.prompts extend --prompts DIR --extra EXTRA      # on a machine without the downloads
    python -m train.prompts stats DIR

DIR gets:
- prompts-NNNNN.jsonl.gz: one record a line, {"id", "source", "turns": [user text, ...], "system"?: text}, in
  a seeded random order (so a generation stopped part-way has covered every source evenly);
- eval/mtbench.jsonl (the 80 MT-Bench questions: {"prompt": first turn, "category", ...}) and
  eval/humaneval.jsonl (164 HumanEval problems): held-out evaluation sets;
- manifest.json: per source the prompts made, held out, dropped as duplicates, written; licenses; the package
  versions used; each shard's size and sha256.

Hold-out (train.dedupe.HoldOut): no prompt may equal, contain, or share half the word 6-grams of an
evaluation item; checked again on what is written. Deduplication: exact after normalisation, then MinHash
near-duplicates (Jaccard >= 0.8). Sources are processed in a fixed order; the first copy wins.
--extra DIR adds prompt records from *.jsonl.gz / *.jsonl files (e.g. python -m train.self_instruct's output)
under their own "source" tags, through the same hold-out and deduplication.
--multi-turn N turns N single-turn prompts of chat-like sources into two-turn conversations (a follow-up
request; the target answers both turns at generation), tagged "multi-turn".
"""

import argparse
import gzip
import hashlib
import json
import pathlib
import random
import sys
import time

from train import dedupe, templates
from train.prompt_sources import SOURCES, Fetcher, Source, humaneval, mtbench

MULTI_TURN_FROM = ("chat-templates", "wordnet", "foldoc", "fortunes", "openai-evals", "python-code", "math-word")


def record_text(record: dict) -> str:
    return "\n".join(([record["system"]] if record.get("system") else []) + list(record["turns"]))


def read_records(folder: pathlib.Path) -> list[dict]:
    out = []
    for path in sorted(folder.glob("*.jsonl.gz")) + sorted(folder.glob("*.jsonl")):
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as fh:
            out += [json.loads(line) for line in fh if line.strip()]
    return out


class Admission:
    """The build's rules for one record at a time: clear of the held-out items, new after normalisation and not
    a near duplicate of anything admitted before; per-source counts."""

    def __init__(self, held_out: list[str]):
        self.hold = dedupe.HoldOut(held_out)
        self.seen = dedupe.MinHashDeduper()
        self.counts: dict[str, dict] = {}

    def remember(self, records: list[dict]) -> None:
        """Records already written (an earlier build): later ones must not repeat them."""
        for r in records:
            self.seen.add(record_text(r))

    def admit(self, name: str, raw: dict) -> dict | None:
        c = self.counts.setdefault(name, {"made": 0, "held_out": 0, "duplicates": 0, "written": 0})
        c["made"] += 1
        turns = [t for t in raw.get("turns", []) if isinstance(t, str) and t.strip()]
        if not turns:
            return None
        rec = {"source": name, "turns": turns, **({"system": raw["system"]} if raw.get("system") else {})}
        text = record_text(rec)
        if self.hold.hits(text):
            c["held_out"] += 1
            return None
        if not self.seen.add(text):
            c["duplicates"] += 1
            return None
        rec["id"] = f"{name}:{hashlib.sha1(dedupe.normalise(text).encode()).hexdigest()[:16]}"
        return rec


def build(
    sources: list[Source],
    fetch: Fetcher,
    held_out: list[str],
    seed: int = 0,
    scale: float = 1.0,
    extra: list[dict] = (),
    multi_turn: int = 0,
    log=print,
) -> tuple[list[dict], dict]:
    """(records, per-source counts). Every record is new after normalisation, not a near duplicate of an
    earlier one, and clear of `held_out`."""
    gate = Admission(held_out)
    hold, counts = gate.hold, gate.counts
    records: list[dict] = []

    def admit(name: str, raw: dict) -> None:
        rec = gate.admit(name, raw)
        if rec is not None:
            records.append(rec)

    for source in sources:
        begin = time.time()
        rng = random.Random(f"{seed}:{source.name}")
        for raw in source.make(fetch, rng, max(1, int(source.limit * scale))):
            admit(source.name, raw)
        c = counts.get(source.name, {})
        log(
            f"{source.name}: {c.get('made', 0)} made, {c.get('held_out', 0)} held out, {c.get('duplicates', 0)} "
            f"duplicates ({time.time() - begin:.0f} s)"
        )
    for raw in extra:
        admit(raw.get("source") or "extra", raw)
    if multi_turn:
        rng = random.Random(f"{seed}:multi-turn")
        pool = [i for i, r in enumerate(records) if r["source"] in MULTI_TURN_FROM and len(r["turns"]) == 1]
        for i in rng.sample(pool, min(multi_turn, len(pool))):
            r = records[i]
            counts[r["source"]]["moved_to_multi_turn"] = counts[r["source"]].get("moved_to_multi_turn", 0) + 1
            r["turns"] = r["turns"] + [templates.follow_up(rng)]
            r["origin"], r["source"] = r["source"], "multi-turn"
            r["id"] = "multi-turn:" + r["id"].split(":", 1)[1]
            counts.setdefault("multi-turn", {"made": 0, "held_out": 0, "duplicates": 0, "written": 0})["made"] += 1
    # the final check, on the records as they will be written
    records = [r for r in records if not hold.hits(record_text(r))]
    for r in records:
        counts[r["source"]]["written"] += 1
    random.Random(f"{seed}:order").shuffle(records)
    return records, counts


def extend(records: list[dict], extra: list[dict], held_out: list[str]) -> tuple[list[dict], dict]:
    """(the extra records that pass, their counts): the build's rules with `records` (a built folder's) taken as
    admitted before them. Lets the GPU machine, which has no downloads, add self-instruct prompts to the
    carried build; the same extras given to `build --extra` get the same ids."""
    gate = Admission(held_out)
    gate.remember(records)
    added = [rec for raw in extra if (rec := gate.admit(raw.get("source") or "extra", raw)) is not None]
    for r in added:
        gate.counts[r["source"]]["written"] += 1
    return added, gate.counts


def write_shards(records: list[dict], out: pathlib.Path, shard_size: int, first_index: int = 0) -> list[dict]:
    shards = []
    for n, first in enumerate(range(0, len(records), shard_size), start=first_index):
        path = out / f"prompts-{n:05d}.jsonl.gz"
        data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records[first : first + shard_size]).encode()
        with open(path, "wb") as fh, gzip.GzipFile(fileobj=fh, mode="wb", compresslevel=9, mtime=0) as gz:
            gz.write(data)
        shards.append(
            {
                "file": path.name,
                "records": len(records[first : first + shard_size]),
                "bytes": path.stat().st_size,
                "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            }
        )
    return shards


def evaluation_sets(fetch: Fetcher) -> dict[str, list[dict]]:
    return {"mtbench": mtbench(fetch), "humaneval": humaneval(fetch)}


def held_out_texts(evals: dict[str, list[dict]]) -> list[str]:
    """Every text of every evaluation item: MT-Bench's both turns, HumanEval's prompt and bare code."""
    texts = []
    for item in evals["mtbench"]:
        texts += item["turns"]
    for item in evals["humaneval"]:
        texts += [item["prompt"], item["code"]]
    return texts


def main_build(args) -> int:
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("prompts-*.jsonl.gz"):
        old.unlink()
    fetch = Fetcher(pathlib.Path(args.cache))
    evals = evaluation_sets(fetch)
    (out / "eval").mkdir(exist_ok=True)
    for name, items in evals.items():
        (out / "eval" / f"{name}.jsonl").write_text("".join(json.dumps(i) + "\n" for i in items))
    only = set(args.only.split(",")) if args.only else None
    sources = [s for s in SOURCES if only is None or s.name in only]
    extra = read_records(pathlib.Path(args.extra)) if args.extra else []
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    records, counts = build(sources, fetch, held_out_texts(evals), args.seed, args.scale, extra, args.multi_turn, log)
    shards = write_shards(records, out, args.shard_size)
    manifest = {
        "prompts": len(records),
        "seed": args.seed,
        "scale": args.scale,
        "counts": counts,
        "sources": {s.name: {"kind": s.kind, "license": s.license, "origin": s.origin} for s in sources},
        "packages": fetch.used,
        "held_out": {k: len(v) for k, v in evals.items()},
        "shards": shards,
        "bytes": sum(s["bytes"] for s in shards),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print_stats(manifest)
    return 0


def main_extend(args) -> int:
    """Adds --extra's records to the built folder --prompts in place: new shards after the last one, the
    manifest's counts and shards updated; nothing else is rewritten (generation keys answers by prompt id)."""
    out = pathlib.Path(args.prompts)
    manifest = json.loads((out / "manifest.json").read_text())
    evals = {
        name: [json.loads(x) for x in (out / "eval" / f"{name}.jsonl").read_text().splitlines() if x.strip()]
        for name in ("mtbench", "humaneval")
    }
    added, counts = extend(read_records(out), read_records(pathlib.Path(args.extra)), held_out_texts(evals))
    random.Random(f"{args.seed}:extend").shuffle(added)
    shards = write_shards(added, out, args.shard_size, first_index=len(manifest["shards"]))
    for name, c in counts.items():
        was = manifest["counts"].setdefault(name, {"made": 0, "held_out": 0, "duplicates": 0, "written": 0})
        for key in ("made", "held_out", "duplicates", "written"):
            was[key] += c[key]
    manifest["prompts"] += len(added)
    manifest["shards"] += shards
    manifest["bytes"] = sum(s["bytes"] for s in manifest["shards"])
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print_stats(manifest)
    return 0


def print_stats(manifest: dict) -> None:
    print(f"{'source':16} {'made':>8} {'held out':>9} {'dupes':>8} {'written':>8}")
    for name, c in sorted(manifest["counts"].items(), key=lambda kv: -kv[1]["written"]):
        print(f"{name:16} {c['made']:8d} {c['held_out']:9d} {c['duplicates']:8d} {c['written']:8d}")
    print(f"{manifest['prompts']} prompts in {len(manifest['shards'])} shards, {manifest['bytes'] / 2**20:.1f} MiB")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m train.prompts", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="fetch, hold out, deduplicate, write shards")
    b.add_argument("--out", required=True)
    b.add_argument("--cache", default=".cache/train/downloads", help="downloaded packages (reused)")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--scale", type=float, default=1.0, help="multiply every source's limit")
    b.add_argument("--only", help="comma-separated source names")
    b.add_argument("--extra", help="a folder of extra prompt records (*.jsonl.gz, *.jsonl)")
    b.add_argument("--multi-turn", type=int, default=6000)
    b.add_argument("--shard-size", type=int, default=20000)
    e = sub.add_parser("extend", help="add extra records to a built folder (same rules, no downloads)")
    e.add_argument("--prompts", required=True, help="a folder written by build")
    e.add_argument("--extra", required=True, help="a folder of extra prompt records (*.jsonl.gz, *.jsonl)")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--shard-size", type=int, default=20000)
    s = sub.add_parser("stats", help="print a built folder's counts")
    s.add_argument("dir")
    args = p.parse_args(argv)
    if args.command == "build":
        return main_build(args)
    if args.command == "extend":
        return main_extend(args)
    print_stats(json.loads((pathlib.Path(args.dir) / "manifest.json").read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
