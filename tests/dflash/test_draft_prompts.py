"""The draft's training prompts: every source contributes, MT-Bench (the held-out set) does not."""

import json

import pytest

from modeld.draft_prompts import INSTRUCTIONS, TEMPLATES, TOPICS, main


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """One run of main with --eval-out: (the training prompts, the evaluation prompts)."""
    folder = tmp_path_factory.mktemp("prompts")
    out, eval_out = folder / "prompts.jsonl", folder / "mtbench.jsonl"
    assert main(["--out", str(out), "--eval-out", str(eval_out), "--shakespeare", "40", "--docstrings", "30",
                 "--seed", "1"]) == 0
    return tuple([json.loads(line)["prompt"] for line in path.read_text().splitlines()] for path in (out, eval_out))


def test_prompts_from_every_source(written):
    prompts, _ = written
    assert sum(p.startswith("Complete this Python function:") for p in prompts) == 164  # all of HumanEval
    excerpts = [p for p in prompts if p.split("\n\n")[0] in INSTRUCTIONS]
    assert len(excerpts) == 40 and all(len(p.split("\n\n", 1)[1].splitlines()) == 6 for p in excerpts)
    assert sum(p.startswith("Explain what the Python function") for p in prompts) == 30
    assert sum(p in {t.format(topic) for t in TEMPLATES for topic in TOPICS} for p in prompts) == len(TEMPLATES) * len(TOPICS)
    assert len(prompts) == 164 + 40 + 30 + len(TEMPLATES) * len(TOPICS)
    assert len(set(prompts)) > 0.95 * len(prompts)


def test_mtbench_first_turns_are_held_out(written):
    prompts, held_out = written
    assert len(held_out) == 80 and len(set(held_out)) == 80
    assert all(isinstance(p, str) and p.strip() for p in held_out)
    assert any(p.startswith("Compose an engaging travel blog post about a recent trip to Hawaii") for p in held_out)
    assert not set(held_out) & set(prompts)
    assert not any(q in p for q in held_out for p in prompts)  # not even inside a longer training prompt
