"""bench.serving.clients' rows (the runs themselves need a GPU)."""

from bench.serving.clients import parse_args


def test_by_default_as_served_against_prompt_chunks_beside_the_decodes_and_other_thresholds():
    assert [r.name for r in parse_args(["--target", "t"]).rows] == [
        "plain as served",
        "plain as served, alone_prompt_tokens=0",
        "DFLASH as served",
        "DFLASH as served, alone_prompt_tokens=0",
        "DFLASH as served, adaptive_speculation=false",
    ]


def test_without_a_draft_the_plain_rows_alone():
    assert [r.name for r in parse_args(["--draft", "none"]).rows] == [
        "plain as served",
        "plain as served, alone_prompt_tokens=0",
    ]
