"""The draft's training prompts: every source contributes, MT-Bench (the held-out set) does not."""

import json

from modeld.draft_prompts import INSTRUCTIONS, TEMPLATES, TOPICS, main


def test_prompts_from_every_source(tmp_path):
    out = tmp_path / "prompts.jsonl"
    assert main(["--out", str(out), "--shakespeare", "40", "--docstrings", "30", "--seed", "1"]) == 0
    prompts = [json.loads(line)["prompt"] for line in out.read_text().splitlines()]
    assert sum(p.startswith("Complete this Python function:") for p in prompts) == 164  # all of HumanEval
    excerpts = [p for p in prompts if p.split("\n\n")[0] in INSTRUCTIONS]
    assert len(excerpts) == 40 and all(len(p.split("\n\n", 1)[1].splitlines()) == 6 for p in excerpts)
    assert sum(p.startswith("Explain what the Python function") for p in prompts) == 30
    assert sum(p in {t.format(topic) for t in TEMPLATES for topic in TOPICS} for p in prompts) == len(TEMPLATES) * len(TOPICS)
    assert len(set(prompts)) > 0.95 * len(prompts)
