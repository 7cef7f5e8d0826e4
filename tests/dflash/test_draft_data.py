"""Draft training data through the real daemons: the target's own greedy and sampled answers."""

import json

from modeld.draft_data import main
from tests.daemons import run_memd, run_modeld


def test_answers_through_modeld(tmp_path, default_model, tokenizer, chat_ids):
    (tmp_path / "prompts.jsonl").write_text("\n".join(json.dumps({"prompt": p}) for p in
                                                      ["What is the capital of France?", "Write a haiku about the sea."]))
    args = ["--max-running-requests", "4", "--max-total-tokens", "4096", "--draft-model", "none",
            "--kv-cache-dtype", "float32", "--strict"]
    with run_memd(default_model, *args) as memd, run_modeld(memd, "--target-model", str(default_model)) as modeld:
        assert main(["--addr", modeld.address, "--target", str(default_model), "--prompts", str(tmp_path / "prompts.jsonl"),
                     "--out", str(tmp_path / "seqs.jsonl"), "--samples", "2", "--max-new-tokens", "12"]) == 0
    records = [json.loads(line) for line in (tmp_path / "seqs.jsonl").read_text().splitlines()]
    assert len(records) == 4
    assert records[0]["ids"][: records[0]["response_start"]] == chat_ids[0]
    assert all(0 < len(r["ids"]) - r["response_start"] <= 12 for r in records)
    assert records[0]["ids"] != records[1]["ids"] or records[2]["ids"] != records[3]["ids"]  # greedy vs sampled
