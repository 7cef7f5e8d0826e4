"""`python -m client` run in-process against FakeModeld and FakeMemd."""

import json

from client.__main__ import main
from tests.client.fake_modeld import INVALID_TEMPERATURE


def test_generate_prints_text_then_meta(fake_modeld, capsys):
    code = main(
        [
            "--addr",
            fake_modeld.address,
            "generate",
            "hello",
            "--max-new-tokens",
            "4",
            "--temperature",
            "0",
            "--top-p",
            "0.9",
            "--top-k",
            "3",
            "--seed",
            "1",
            "--stop",
            "a",
            "b",
            "--chat",
        ]
    )
    assert code == 0
    text, meta = capsys.readouterr().out.splitlines()
    assert text == "hell"
    assert meta == "[finish=length prompt=5 completion=4 cached=1 verify=2 accept_length=2.00 id=fake-1]"
    s = fake_modeld.requests[0].sampling
    assert (s.max_new_tokens, s.temperature, s.top_k, s.seed, list(s.stop)) == (4, 0.0, 3, 1, ["a", "b"])
    assert fake_modeld.requests[0].apply_chat_template


def test_generate_json(fake_modeld, capsys):
    assert main(["--addr", fake_modeld.address, "generate", "hi", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["text"], result["output_ids"], result["finish_reason"]) == ("hi", [104, 105], "stop")


def test_generate_stream(fake_modeld, capsys):
    assert main(["--addr", fake_modeld.address, "generate", "hello", "--stream"]) == 0
    text, meta = capsys.readouterr().out.splitlines()
    assert text == "hello" and meta.startswith("[finish=stop prompt=5 completion=5")


def test_generate_stream_json_prints_one_line_per_chunk_then_the_result(fake_modeld, capsys):
    assert main(["--addr", fake_modeld.address, "generate", "hey", "--stream", "--json"]) == 0
    *chunks, result = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert chunks == [{"token_ids": [ord(c)], "text": c, "logprobs": []} for c in "hey"]
    assert result["text"] == "hey" and result["completion_tokens"] == 3


def test_server_error_exits_non_zero_with_the_status(fake_modeld, capsys):
    assert main(["--addr", fake_modeld.address, "generate", "hello", "--temperature", "-1"]) == 1
    assert capsys.readouterr().err.strip() == f"error: INVALID_ARGUMENT: {INVALID_TEMPERATURE}"


def test_health_reports_both_daemons(fake_modeld, memd_address, capsys):
    assert main(["--addr", fake_modeld.address, "--memd", memd_address, "health"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"modeld {fake_modeld.address}: SERVING",
        f"memd {memd_address}: SERVING",
    ]


def test_health_fails_when_a_daemon_is_down(fake_modeld, nowhere, capsys):
    assert main(["--addr", fake_modeld.address, "--memd", nowhere, "health"]) == 1
    assert capsys.readouterr().out.splitlines()[1] == f"memd {nowhere}: UNAVAILABLE"


def test_health_with_only_memd_given_asks_memd_alone(memd_address, capsys):
    assert main(["--memd", memd_address, "health"]) == 0
    assert capsys.readouterr().out.splitlines() == [f"memd {memd_address}: SERVING"]


def test_capacity_through_modeld(fake_modeld, capsys):
    assert main(["--addr", fake_modeld.address, "capacity"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[:3] == ["target", "1000", "900"]
    assert lines[-1] == "modeld running=2 waiting=1"
    assert main(["--addr", fake_modeld.address, "capacity", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["memd"]["target"]["free"] == 900


def test_capacity_directly_from_memd(memd_address, capsys):
    assert main(["--memd", memd_address, "capacity", "--json"]) == 0
    capacity = json.loads(capsys.readouterr().out)
    assert capacity["target"]["used"] == 100 and "memd" not in capacity


def test_capacity_table_shows_the_prefix_cache(memd_address, capsys):
    assert main(["--memd", memd_address, "capacity"]) == 0
    header, target, *_ = capsys.readouterr().out.splitlines()
    row = dict(zip(header.split(), target.split()))
    assert (row["used"], row["held"], row["evictable"], row["protected"]) == ("100", "70", "20", "10")


def test_capacity_table_lists_sessions_by_label(memd_address, capsys):
    assert main(["--memd", memd_address, "capacity"]) == 0
    assert (
        capsys.readouterr().out.splitlines()[-1]
        == "  session 1 (modeld, model 0123456789abcdef): target 70 draft 0 tokens held"
    )


def test_flush_cache_asks_memd(memd_address, capsys):
    assert main(["--memd", memd_address, "flush-cache"]) == 0
    assert capsys.readouterr().out.strip() == "flushed prefix cache: target_freed=64 draft_freed=16"
    assert main(["--memd", memd_address, "flush-cache", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"target_freed": 0, "draft_freed": 0}


def test_info_prints_json(fake_modeld, capsys):
    assert main(["--addr", fake_modeld.address, "info"]) == 0
    assert json.loads(capsys.readouterr().out)["target_model"] == "fake-target"


def test_unreachable_daemons_exit_non_zero(nowhere, capsys):
    assert main(["--addr", nowhere, "--connect-timeout", "0.2", "capacity"]) == 1
    assert capsys.readouterr().err.startswith(f"error: UNAVAILABLE: could not connect to {nowhere}")
    assert main(["--memd", nowhere, "capacity"]) == 1
    assert capsys.readouterr().err.startswith("error: UNAVAILABLE: ")
    assert main(["--memd", nowhere, "flush-cache"]) == 1
    assert capsys.readouterr().err.startswith("error: UNAVAILABLE: ")
