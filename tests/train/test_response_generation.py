"""Response generation: through a real memd + modeld (CPU), through modeld's engine in this process over a real
memd (the same answers as the service, greedy and seeded samples), and by the HF fallback; stopped part-way
and run again, it neither loses nor repeats a (prompt, sample); requests carry the serving path's chat
template, and a multi-turn prompt's second request holds the first answer."""

import gzip
import json

import pytest

import client
from tests.conftest import greedy
from tests.daemons import run_memd, run_modeld
from train import chat, loops, responses
from train.generate import main, make_jobs, parse_sampling

PROMPTS = [
    {"id": "t:0", "source": "t", "turns": ["What is the capital of France?"]},
    {"id": "t:1", "source": "t", "turns": ["Reply with only the number: what is 2+2?"]},
    {"id": "t:2", "source": "t", "turns": ["Say yes."], "system": "You answer briefly."},
    {"id": "m:3", "source": "multi-turn", "turns": ["Name a colour.", "Why that one?"]},
]


def write_prompts(folder):
    folder.mkdir()
    with gzip.open(folder / "prompts-00000.jsonl.gz", "wt") as fh:
        fh.writelines(json.dumps(p) + "\n" for p in PROMPTS)
    return folder


def read_all(out):
    items = [item for path in responses.shard_paths(out) for item in responses.read_shard(path)]
    return {r["key"]: (r, answers) for r, answers in items}, [r["key"] for r, _ in items]


def test_parse_sampling():
    assert parse_sampling("greedy,0.8") == [0.0, 0.8] and parse_sampling("0.7") == [0.7]


def test_sources_first_orders_jobs_and_keeps_the_rest():
    done = {"t:1#0"}
    jobs = make_jobs(PROMPTS, [0.0, 0.8], done, None, ("multi-turn",))
    keys = [f"{record['id']}#{k}" for record, k in jobs]
    assert keys == ["m:3#0", "m:3#1", "t:0#0", "t:0#1", "t:1#1", "t:2#0", "t:2#1"]
    assert [f"{r['id']}#{k}" for r, k in make_jobs(PROMPTS, [0.0], done, 2)] == ["t:0#0"]


def test_modeld_stop_and_resume(tmp_path, default_model, tokenizer):
    prompts = write_prompts(tmp_path / "prompts")
    out = tmp_path / "out"
    args = [
        "--max-running-requests",
        "4",
        "--max-total-tokens",
        "4096",
        "--draft-model",
        "none",
        "--kv-cache-dtype",
        "float32",
        "--strict",
    ]
    common = [
        "--prompts",
        str(prompts),
        "--out",
        str(out),
        "--target",
        str(default_model),
        "--sampling",
        "greedy,0.8",
        "--max-new-tokens",
        "10",
        "--concurrency",
        "3",
        "--shard-records",
        "1",
    ]
    with run_memd(default_model, *args) as memd, run_modeld(memd, "--target-model", str(default_model)) as modeld:
        assert main(common + ["--addr", modeld.address, "--max-answers", "2"]) == 0
        first, _ = read_all(out)
        assert 2 <= len(first) < 8  # stopped part-way; what finished is on disk
        assert main(common + ["--addr", modeld.address]) == 0
        with client.Client(modeld.address, timeout=600) as c:
            served = c.generate(PROMPTS[0]["turns"][0], chat=True, max_new_tokens=10, temperature=0)
    done, keys = read_all(out)
    assert len(keys) == len(set(keys)) == 8  # nothing repeated, nothing lost
    assert set(done) == {f"{p['id']}#{k}" for p in PROMPTS for k in (0, 1)}
    assert all(first[key][1] == done[key][1] for key in first)  # the first run's answers are kept as they were
    # The request is what the service makes of the text with the chat template: the same greedy answer.
    assert done["t:0#0"][1] == [list(served.output_ids)]
    record, answers = done["m:3#0"]
    assert record["turns"] == 2 and record["temperature"] == 0.0 and done["m:3#1"][0]["temperature"] == 0.8
    ids, spans = chat.conversation(tokenizer, PROMPTS[3], answers)
    second = chat.turn_prompt(tokenizer, PROMPTS[3], answers[:1])
    assert ids == second + answers[1] and spans[-1] == (len(second), len(ids))
    assert tokenizer.decode(answers[0], skip_special_tokens=True) in tokenizer.decode(second)
    assert len(spans) == 2 and ids[spans[0][0] : spans[0][1]] == answers[0]


def test_inproc_stop_and_resume_gives_the_services_answers(tmp_path, default_model):
    prompts = write_prompts(tmp_path / "prompts")
    out, served = tmp_path / "out", tmp_path / "served"
    args = [
        "--max-running-requests",
        "4",
        "--max-total-tokens",
        "4096",
        "--draft-model",
        "none",
        "--kv-cache-dtype",
        "float32",
        "--strict",
    ]
    common = [
        "--device",
        "cpu",
        "--prompts",
        str(prompts),
        "--target",
        str(default_model),
        "--sampling",
        "greedy,0.8",
        "--max-new-tokens",
        "10",
        "--concurrency",
        "3",
        "--shard-records",
        "1",
    ]
    with run_memd(default_model, *args) as memd:  # ends by checking memd's pools free (or only cached)
        inproc = common + ["--engine", "inproc", "--memd", memd.address, "--out", str(out)]
        assert main(inproc + ["--max-answers", "2"]) == 0
        first, _ = read_all(out)
        assert 2 <= len(first) < 8  # stopped part-way; what finished is on disk
        assert main(inproc) == 0
        with run_modeld(memd, "--target-model", str(default_model)) as modeld:
            assert main(common + ["--engine", "modeld", "--addr", modeld.address, "--out", str(served)]) == 0
    done, keys = read_all(out)
    assert len(keys) == len(set(keys)) == 8  # nothing repeated, nothing lost
    assert all(first[key][1] == done[key][1] for key in first)
    by_service, _ = read_all(served)
    assert {key: answers for key, (_, answers) in done.items()} == {
        key: answers for key, (_, answers) in by_service.items()
    }
    assert done["m:3#1"][0]["turns"] == 2 and len(done["m:3#1"][1]) == 2


def test_inproc_stops_an_answer_in_a_repetition_loop_and_keeps_it(tmp_path, default_model, tokenizer, hf_greedy):
    looping = {"id": "l:0", "source": "l", "turns": ["Write the letter a 300 times."]}  # "A, A, A, ..." greedily
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    with gzip.open(prompts / "prompts-00000.jsonl.gz", "wt") as fh:
        fh.writelines(json.dumps(p) + "\n" for p in (looping, PROMPTS[0]))
    out = tmp_path / "out"
    with run_memd(
        default_model,
        "--max-running-requests",
        "4",
        "--max-total-tokens",
        "4096",
        "--draft-model",
        "none",
        "--kv-cache-dtype",
        "float32",
        "--strict",
    ) as memd:  # ends by checking memd's pools free (or only cached)
        assert (
            main(
                [
                    "--engine",
                    "inproc",
                    "--memd",
                    memd.address,
                    "--device",
                    "cpu",
                    "--prompts",
                    str(prompts),
                    "--target",
                    str(default_model),
                    "--sampling",
                    "greedy",
                    "--max-new-tokens",
                    "400",
                    "--out",
                    str(out),
                ]
            )
            == 0
        )
    done, _ = read_all(out)
    answer = done["l:0#0"][1][0]
    full = hf_greedy(chat.turn_prompt(tokenizer, looping, []), 400)
    assert len(full) == 400 and loops.ends_in_loop(full)  # left alone, the target loops to the token limit
    assert loops.STOP_TOKENS <= len(answer) < 200 and loops.ends_in_loop(answer)  # stopped within a check or so
    assert answer == full[: len(answer)]  # the target's own tokens, cut
    other = done["t:0#0"][1][0]
    assert other == hf_greedy(chat.turn_prompt(tokenizer, PROMPTS[0], []), 400)  # an answer without a loop: whole


def test_hf_fallback_stop_and_resume(tmp_path, default_model, tokenizer, hf_models):
    prompts = write_prompts(tmp_path / "prompts")
    out = tmp_path / "out"
    common = [
        "--engine",
        "hf",
        "--device",
        "cpu",
        "--prompts",
        str(prompts),
        "--out",
        str(out),
        "--target",
        str(default_model),
        "--max-new-tokens",
        "10",
        "--batch",
        "2",
        "--limit",
        "3",
    ]
    assert main(common + ["--max-answers", "2"]) == 0
    first, _ = read_all(out)
    assert len(first) == 2
    assert main(common) == 0
    assert main(common) == 0  # nothing left to do: nothing added
    done, keys = read_all(out)
    assert len(keys) == len(set(keys)) == 3 and set(done) == {"t:0#0", "t:1#0", "t:2#0"}
    eos = tokenizer.eos_token_id
    for p in PROMPTS[:3]:
        ids = chat.turn_prompt(tokenizer, p, [])
        expected = greedy(hf_models("cpu"), ids, 10)
        expected = expected[: expected.index(eos) + 1] if eos in expected else expected
        assert done[f"{p['id']}#0"][1] == [expected], p


def test_pack_merges_shards(tmp_path):
    items = [
        (
            {"key": f"p:{i}#0", "id": f"p:{i}", "source": "s", "sample": 0, "temperature": 0.0, "turns": 1},
            [[i, i + 1, 2]],
        )
        for i in range(10)
    ]
    for i in range(0, 10, 2):
        responses.write_shard(tmp_path / f"responses-x-{i:04d}.npz", items[i : i + 2])
    made = responses.pack(tmp_path, tmp_path / "packed", max_mib=1)
    assert len(made) == 1
    assert list(responses.read_shard(made[0])) == items
    assert responses.done_keys(tmp_path / "packed") == {r["key"] for r, _ in items}


def test_self_instruct_cleaning():
    from train.self_instruct import clean

    assert clean('Question: "How do volcanoes form?"\nSure!') == "How do volcanoes form?"
    assert clean("Sure, here is a question.") is None and clean("Hi?") is None
    assert clean('**"What would you do if you were a climber?":**') == "What would you do if you were a climber?"


def test_self_instruct_reads_every_item_of_a_numbered_list():
    from train.self_instruct import questions

    text = (
        "Here are five questions:\n1. **What is a drone used for?**\n2) How high can a drone fly legally?\n"
        "3. Hi?\nSome closing words.\n4. How to find a hospital? 5. How to book a hospital bed at night?"
    )
    assert questions(text) == [
        "What is a drone used for?",
        "How high can a drone fly legally?",
        "How to find a hospital?",
        "How to book a hospital bed at night?",
    ]
    assert questions("No list here, only prose about 3. things.") == []


def test_engine_flags_that_do_not_go_together_are_refused(tmp_path, capsys):
    common = ["--prompts", str(tmp_path), "--out", str(tmp_path / "out")]
    for flags, message in [
        (["--engine", "hf", "--addr", "unix:///x"], "--addr is a modeld's address"),
        (["--engine", "modeld", "--memd", "unix:///x"], "--memd is for --engine inproc"),
    ]:
        with pytest.raises(SystemExit):
            main(common + flags)
        assert message in capsys.readouterr().err
