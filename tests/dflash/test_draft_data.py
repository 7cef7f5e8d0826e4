"""Draft training data through the real daemons: the target's own greedy and sampled answers."""

import json

from modeld.draft_data import main
from tests.conftest import greedy
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


HF_PROMPTS = ["What is the capital of France?",  # greedy answer ends with EOS at token 8
              "Reply with only the number: what is 2+2?",  # ... at token 7
              "Say yes."]  # no EOS within 10 tokens


def test_answers_by_hf_generate(tmp_path, default_model, tokenizer, hf_models):
    (tmp_path / "prompts.jsonl").write_text("\n".join(json.dumps({"prompt": p}) for p in HF_PROMPTS))
    assert main(["--engine", "hf", "--target", str(default_model), "--prompts", str(tmp_path / "prompts.jsonl"),
                 "--out", str(tmp_path / "seqs.jsonl"), "--samples", "2", "--max-new-tokens", "10", "--batch", "3"]) == 0
    records = [json.loads(line) for line in (tmp_path / "seqs.jsonl").read_text().splitlines()]
    prompt_ids = {tuple(tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                                      tokenize=True, return_dict=False)): p for p in HF_PROMPTS}
    assert len(records) == 6
    by_prompt = {}
    for r in records:
        by_prompt.setdefault(tuple(r["ids"][: r["response_start"]]), []).append(r["ids"][r["response_start"] :])
    assert sorted(by_prompt) == sorted(prompt_ids) and all(len(answers) == 2 for answers in by_prompt.values())
    assert all(1 <= len(r["ids"]) - r["response_start"] <= 10 for r in records)
    eos, expected = tokenizer.eos_token_id, {}
    for ids in prompt_ids:
        answer = greedy(hf_models("cpu"), list(ids), 10)
        expected[ids] = answer[: answer.index(eos) + 1] if eos in answer else answer
    assert sum(eos in answer for answer in expected.values()) == 2  # the prompts exercise the EOS cut and its absence
    # Jobs run greedy first (one left-padded batch of 3 here), then the sampled ones.
    greedy_records, sampled_records = records[:3], records[3:]
    assert {tuple(r["ids"][: r["response_start"]]) for r in greedy_records} == set(prompt_ids)
    for r in greedy_records:
        prompt = tuple(r["ids"][: r["response_start"]])
        assert r["ids"][r["response_start"] :] == expected[prompt], prompt_ids[prompt]
    assert any(r["ids"][r["response_start"] :] != expected[tuple(r["ids"][: r["response_start"]])]
               for r in sampled_records)


def test_hf_engine_stops_at_max_seconds(tmp_path, default_model):
    (tmp_path / "prompts.jsonl").write_text(json.dumps({"prompt": HF_PROMPTS[0]}))
    (tmp_path / "seqs.jsonl").write_text("stale\n")
    assert main(["--engine", "hf", "--target", str(default_model), "--prompts", str(tmp_path / "prompts.jsonl"),
                 "--out", str(tmp_path / "seqs.jsonl"), "--max-new-tokens", "10", "--max-seconds", "0"]) == 0
    assert (tmp_path / "seqs.jsonl").read_text() == ""
