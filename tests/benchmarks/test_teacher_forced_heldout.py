"""bench.draft.teacher_forced_accept --same-sources: a folder's held-out answers beside as many training answers of
each of its sources; the count of anchors that accept their first drafted position."""

import json
import types

import numpy as np
import torch

from bench.draft import teacher_forced_accept as tfa
from train import chat, responses


def write_folder(folder, records: list[dict], answers: list[list[list[int]]]) -> None:
    """Prompt records (prompts.jsonl) and their answers (a response shard), as train.generate leaves them."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    metas = [
        {"key": f"{r['id']}#0", "id": r["id"], "source": r["source"], "sample": 0, "temperature": 0.0, "turns": len(a)}
        for r, a in zip(records, answers)
    ]
    responses.write_shard(folder / "responses-0.npz", list(zip(metas, answers)))


def test_same_source_rows_match_the_held_out_mix(tmp_path, tokenizer):
    trained = [{"id": f"{s}:{i}", "source": s, "turns": [f"train {s} {i}"]} for s in "abc" for i in range(4)]
    write_folder(tmp_path / "train", trained, [[[100 + i, 200 + i]] for i in range(len(trained))])
    held = [
        {"id": "a:h0", "source": "a", "turns": ["held a 0"]},
        {"id": "b:h0", "source": "b", "turns": ["held b 0"]},
        {"id": "b:h1", "source": "b", "turns": ["held b 1"]},
        {"id": "b:h2", "source": "b", "turns": ["held b 2", "and then?"]},  # two turns: left out, as in training
    ]
    held_answers = [[[7, 8, 9]], [[10, 11]], [[12, 13, 14, 15]], [[16, 17], [18, 19]]]
    write_folder(tmp_path / "held", held, held_answers)
    args = types.SimpleNamespace(same_sources=str(tmp_path / "held"), seed=1)
    records = {r["id"]: r for r in trained}
    rows = tfa.same_source_rows(args, tokenizer, records, tfa.shuffled_answers(str(tmp_path / "train"), 1))
    assert [name for name, _ in rows] == ["training answers (a 1, b 2)", "held-out answers, same sources (a 1, b 2)"]
    training_rows, held_rows = rows[0][1], rows[1][1]
    assert sorted(seq["source"] for seq in training_rows) == ["a", "b", "b"]
    expected = {tuple(chat.conversation(tokenizer, r, a)[0]) for r, a in zip(held[:3], held_answers[:3])}
    assert {tuple(seq["ids"].tolist()) for seq in held_rows} == expected
    for seq in training_rows:
        ((start, end),) = seq["spans"]
        assert seq["ids"][start:end].tolist()[0] in range(100, 100 + len(trained))


def test_first_accepted_counts_anchors_whose_first_position_is_the_label():
    seq = {"ids": np.arange(10)}
    anchors = np.array([2, 3, 4])
    predictions = torch.full((3, 15), -1)
    predictions[:, 0] = torch.tensor([3, 0, 5])  # hit, miss, hit
    weights = torch.ones(3, 15)
    assert tfa.first_accepted(predictions, seq, anchors, weights) == 2
    weights[2, 0] = 0  # a label that weighs nothing is not accepted
    assert tfa.first_accepted(predictions, seq, anchors, weights) == 1
