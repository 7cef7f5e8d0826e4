"""The ShareGPT prompt source: the whole conversations of a JSON array that is cut off part-way, a conversation's
first one or two user turns under the length and language rules, then what the wider rules add (a part that
starts with the assistant's reply, from its second message; longer turns), and (from the package registry) the real
wheel's
records, none of them an MT-Bench first turn."""

import json
import random
import zipfile

from train import dedupe
from train.prompt_sources import SHAREGPT, Fetcher, complete_json_items, mtbench, sharegpt, sharegpt_turns

ASKED = "Can you explain what a hash table is and when I should use one?"
FOLLOW = "And how is that different from a binary search tree?"


def turn(who: str, text: str) -> dict:
    return {"from": who, "value": text}


def test_the_whole_objects_of_a_cut_off_array_are_read():
    items = [{"id": str(i), "conversations": [turn("human", f"question {i}")]} for i in range(3)]
    text = json.dumps(items, indent=2)
    assert list(complete_json_items(text)) == items
    cut = text[: text.index('"2"') + 10]  # the third object is cut off
    assert list(complete_json_items(cut)) == items[:2]
    assert list(complete_json_items("[]")) == []


def test_a_record_is_the_first_one_or_two_user_turns_that_pass():
    assert sharegpt_turns(
        [
            turn("human", ASKED),
            turn("gpt", "A hash table maps keys..."),
            turn("human", FOLLOW),
            turn("gpt", "..."),
            turn("human", "Thanks, what else is there to know?"),
        ]
    ) == [ASKED, FOLLOW]
    assert sharegpt_turns([turn("human", ASKED)]) == [ASKED]
    part = [turn("gpt", "Sure, here it is."), turn("human", ASKED), turn("gpt", "..."), turn("human", FOLLOW)]
    assert sharegpt_turns(part) == []  # starts mid-way: the first rules leave it out, the wider ones take it
    assert sharegpt_turns(part, continued=True) == [ASKED, FOLLOW]
    assert (
        sharegpt_turns([turn("gpt", "Hi!"), turn("gpt", "Anything else?"), turn("human", ASKED)], continued=True) == []
    )
    assert sharegpt_turns([turn("human", ASKED), turn("human", FOLLOW)]) == [ASKED]  # not alternating
    assert sharegpt_turns([turn("human", "hi")]) == []  # under 20 characters
    pasted = "Summarise this: " + "the data of the year " * 240 + "."  # a pasted text with its task, 5,057 characters
    assert sharegpt_turns([turn("human", pasted)]) == [] and sharegpt_turns([turn("human", pasted)], longest=6000) == [
        pasted
    ]
    assert sharegpt_turns([turn("human", "这是什么意思？请解释一下这个问题的答案是什么。")]) == []  # not English
    assert sharegpt_turns([turn("human", ASKED), turn("gpt", "..."), turn("human", "ok")]) == [ASKED]


def test_the_real_wheel_gives_thousands_of_english_requests_clear_of_mtbench(tmp_path):
    fetch = Fetcher(tmp_path)
    records = list(sharegpt(fetch, random.Random(0), 100_000))
    assert 12_000 < len(records) < 17_671  # of the 17,671 whole conversations, those with a usable first user turn
    assert all(1 <= len(r["turns"]) <= 2 and all(20 <= len(t) <= 6000 for t in r["turns"]) for r in records)
    with zipfile.ZipFile(fetch.pypi(SHAREGPT[0])) as wheel:  # the first rules' records lead, in the file's order
        items = complete_json_items(wheel.read(SHAREGPT[1]).decode("utf-8", "replace"))
        first = [{"turns": t} for t in (sharegpt_turns(i.get("conversations") or []) for i in items) if t]
    assert 7_000 < len(first) < len(records) - 4_000 and records[: len(first)] == first
    assert sum(any(len(t) > 2000 for t in r["turns"]) for r in records) > 500
    assert sum(len(r["turns"]) == 2 for r in records) > 2_000
    assert len(list(sharegpt(fetch, random.Random(0), 50))) == 50
    hold = dedupe.HoldOut([q["prompt"] for q in mtbench(fetch)])
    assert sum(hold.hits(" ".join(r["turns"])) for r in records) == 0  # the build's hold-out would drop any
