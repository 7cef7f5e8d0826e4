"""Response shards: the target's answers, compact (token ids as uint16 when the vocabulary allows, deflated).

A shard is an .npz with
- tokens: every answer's ids, concatenated (uint16 or int32);
- lengths: int32, one per answer (a record of k turns has k answers, consecutive);
- meta: the JSON of a list of records {"key", "id", "source", "sample", "temperature", "turns"}, where `key` is
  "<prompt id>#<sample index>" (what a restart skips) and `turns` is how many answers the record has.

Prompt ids are not stored: the trainer rebuilds each conversation from the prompt record and the answers with
train.chat.conversation, exactly as generation built its requests. Shards are written to a temporary name and
renamed when complete, so a folder only ever holds whole shards; a run that dies loses at most its open shard.
"""

import io
import json
import os
import pathlib
import time
from typing import Iterator

import numpy as np


def shard_paths(folder: pathlib.Path) -> list[pathlib.Path]:
    return sorted(p for p in pathlib.Path(folder).glob("*.npz") if not p.name.startswith("."))


def read_shard(path: pathlib.Path) -> Iterator[tuple[dict, list[list[int]]]]:
    with np.load(path) as z:
        tokens, lengths, meta = z["tokens"], z["lengths"], json.loads(bytes(z["meta"]).decode())
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    a = 0
    for record in meta:
        answers = [tokens[offsets[i] : offsets[i + 1]].astype(np.int64).tolist() for i in range(a, a + record["turns"])]
        a += record["turns"]
        yield record, answers


def done_keys(folder: pathlib.Path) -> set[str]:
    keys = set()
    for path in shard_paths(folder):
        with np.load(path) as z:
            keys.update(r["key"] for r in json.loads(bytes(z["meta"]).decode()))
    return keys


def write_shard(path: pathlib.Path, items: list[tuple[dict, list[list[int]]]]) -> None:
    flat = [a for _, answers in items for a in answers]
    top = max((max(a) for a in flat if a), default=0)
    tokens = np.array([t for a in flat for t in a], dtype=np.uint16 if top < 2**16 else np.int32)
    lengths = np.array([len(a) for a in flat], dtype=np.int32)
    meta = np.frombuffer(json.dumps([r for r, _ in items]).encode(), dtype=np.uint8)
    buf = io.BytesIO()
    np.savez_compressed(buf, tokens=tokens, lengths=lengths, meta=meta)
    tmp = path.with_name("." + path.name + ".tmp")
    tmp.write_bytes(buf.getvalue())
    os.replace(tmp, path)


class ShardWriter:
    """Collects records; writes a shard every `max_records` records or `max_seconds` seconds, and at close."""

    def __init__(
        self, folder: pathlib.Path, max_records: int = 4000, max_seconds: float = 120.0, prefix: str = "responses"
    ):
        self.folder = pathlib.Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.max_records, self.max_seconds = max_records, max_seconds
        self.run = f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        self.items: list[tuple[dict, list[list[int]]]] = []
        self.count = 0
        self.written = 0
        self.last = time.monotonic()

    def add(self, record: dict, answers: list[list[int]]) -> None:
        self.items.append((record, answers))
        if len(self.items) >= self.max_records or time.monotonic() - self.last > self.max_seconds:
            self.flush()

    def flush(self) -> None:
        self.last = time.monotonic()
        if self.items:
            write_shard(self.folder / f"{self.run}-{self.count:04d}.npz", self.items)
            self.count += 1
            self.written += len(self.items)
            self.items = []


def pack(src: pathlib.Path, out: pathlib.Path, max_mib: float = 15.0) -> list[pathlib.Path]:
    """Merge the shards of `src` into as few as possible under `out`, each at most about `max_mib` MiB
    (what one file may be to come back from the GPU machine)."""
    out.mkdir(parents=True, exist_ok=True)
    items, size, n, made = [], 0, 0, []
    paths = shard_paths(src)
    for path in paths:
        share = path.stat().st_size
        if items and size + share > max_mib * 2**20:
            made.append(out / f"pack-{n:03d}.npz")
            write_shard(made[-1], items)
            items, size, n = [], 0, n + 1
        items += list(read_shard(path))
        size += share
    if items:
        made.append(out / f"pack-{n:03d}.npz")
        write_shard(made[-1], items)
    return made
