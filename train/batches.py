"""The draft trainer's data: training sequences from the prompts and the target's answers, the positions anchors
are drawn from (answer spans, cut at repetition loops), the anchors of an epoch, and the epoch's batches. `tc` is
train.train_draft.TrainConfig (its anchors, batch_anchors, max_len, loop_repeats and seed).
"""

import hashlib
import json
import pathlib

import numpy as np

from train import loops


def valid_anchors(length: int, spans, max_len: int) -> np.ndarray:
    """Positions a with a and a + 1 inside one answer span (and inside max_len)."""
    out = [np.arange(s, min(e, max_len) - 1) for s, e in spans if min(e, max_len) - 1 > s]
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def label_mask(length: int, spans, max_len: int) -> np.ndarray:
    mask = np.zeros(min(length, max_len), dtype=bool)
    for s, e in spans:
        mask[s : min(e, max_len)] = True
    return mask


def anchor_positions(seq: dict, max_len: int, loop_repeats: int) -> np.ndarray:
    """The positions anchors are drawn from: valid_anchors of the answer spans cut `loop_repeats` periods into the
    loop each ends in (train.loops; computed once per sequence and setting, kept in the sequence's dict)."""
    key = f"anchor_spans_{loop_repeats}"
    if key not in seq:
        seq[key] = loops.anchor_spans(seq["ids"], seq["spans"], loop_repeats)
    return valid_anchors(len(seq["ids"]), seq[key], max_len)


def sample_anchors(
    seq: dict, count: int, max_len: int, seed: int, epoch: int, index: int, loop_repeats: int = 0
) -> np.ndarray:
    """`count` anchors (all of them if fewer), drawn for this (seed, epoch, sequence): re-sampled every epoch."""
    valid = anchor_positions(seq, max_len, loop_repeats)
    if len(valid) <= count:
        return valid
    rng = np.random.default_rng([seed, epoch, index])
    return np.sort(rng.choice(valid, size=count, replace=False))


SORT_WINDOW = 4096  # sequences whose batches are packed in length order (then the batches are shuffled)


def epoch_batches(seqs: list[dict], tc, epoch: int) -> list[list[int]]:
    """Sequence indices per step, packed until batch_anchors blocks or batch_tokens tokens: every sequence with an
    anchor once. A seeded order for the epoch, cut into windows of SORT_WINDOW sequences, each packed in length
    order so that a batch holds sequences of about one length (the target's forward pads a batch to its longest
    sequence); the batches are then shuffled, so the schedule does not run from short to long."""
    counts = [min(tc.anchors, len(anchor_positions(s, tc.max_len, tc.loop_repeats))) for s in seqs]
    rng = np.random.default_rng([tc.seed, epoch, 2**31])
    order = rng.permutation(len(seqs)).tolist()
    batches = []
    for start in range(0, len(order), SORT_WINDOW):
        window = sorted(order[start : start + SORT_WINDOW], key=lambda i: len(seqs[i]["ids"]))
        current, blocks, tokens = [], 0, 0
        for i in window:
            if counts[i] == 0:
                continue
            length = min(len(seqs[i]["ids"]), tc.max_len)
            if current and (blocks + counts[i] > tc.batch_anchors or tokens + length > tc.batch_tokens):
                batches.append(current)
                current, blocks, tokens = [], 0, 0
            current.append(i)
            blocks += counts[i]
            tokens += length
        if current:
            batches.append(current)
    return [batches[k] for k in rng.permutation(len(batches)).tolist()]


def weighted(seqs: list[dict], weights: dict[str, int]) -> list[dict]:
    """The sequences with each one of a weighted prompt source there `weights[source]` times: an epoch draws
    anchors for every copy (each its own draw), so that source's answers get that many times the blocks."""
    return [s for s in seqs for _ in range(weights.get(s.get("source"), 1))]


def fingerprint(seqs: list[dict]) -> str:
    h = hashlib.sha256()
    for s in seqs:
        h.update(np.asarray(s["ids"], dtype=np.int64).tobytes())
        h.update(json.dumps([list(map(int, sp)) for sp in s["spans"]]).encode())
    return h.hexdigest()[:16]


def load_sequences(prompts: pathlib.Path, response_dirs: list[pathlib.Path], tokenizer, log=print) -> list[dict]:
    """Every response shard's records as training sequences {"ids", "spans", "source"}, rebuilt with train.chat."""
    from train import chat, responses
    from train.prompts import read_records

    by_id = {r["id"]: r for r in read_records(prompts)}
    seqs, missing = [], 0
    for folder in response_dirs:
        for path in responses.shard_paths(folder):
            for record, answers in responses.read_shard(path):
                prompt = by_id.get(record["id"])
                if prompt is None:
                    missing += 1
                    continue
                ids, spans = chat.conversation(tokenizer, prompt, answers)
                seqs.append({"ids": np.asarray(ids, dtype=np.int32), "spans": spans, "source": prompt.get("source")})
    log(
        f"{len(seqs)} sequences, {sum(e - s for q in seqs for s, e in q['spans'])} answer tokens"
        + (f" ({missing} responses without their prompt, skipped)" if missing else "")
    )
    return seqs
