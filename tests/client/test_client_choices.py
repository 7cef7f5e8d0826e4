"""n samples of one prompt (Client.generate_choices, AsyncClient.generate_choices, `generate --n`) against
FakeModeld: the order the choices start in, their seeds and ids, and what one failed choice does to the others."""

import asyncio
import json
import threading
import time

import grpc
import pytest

from client import AsyncClient, Client, errors
from client.__main__ import main


def test_the_other_choices_start_after_the_first_ones_first_chunk(fake_modeld):
    fake_modeld.proceed.clear()  # every stream waits before answering: choice 0 sends nothing yet
    results = []
    with Client(fake_modeld.address) as client:
        worker = threading.Thread(
            target=lambda: results.extend(client.generate_choices("abc", n=3, seed=5, request_id="q"))
        )
        worker.start()
        time.sleep(0.5)
        assert fake_modeld.most_open_streams == 1  # choices 1 and 2 wait for choice 0's first chunk
        fake_modeld.proceed.set()
        worker.join(10)
    assert [r.request_id for r in results] == ["q", "q-1", "q-2"]
    assert [r.text for r in results] == ["abc"] * 3
    seeds = [r.sampling.seed for r in fake_modeld.requests]
    assert seeds[0] == 5 and sorted(seeds[1:]) == [6, 7]  # choices 1 and 2 start together


def test_seeds_wrap_at_the_uint64_range_and_no_seed_stays_unset(fake_modeld):
    with Client(fake_modeld.address) as client:
        client.generate_choices("x", n=2, seed=2**64 - 1)
        client.generate_choices("x", n=2)
    seeds = [r.sampling.seed if r.sampling.HasField("seed") else None for r in fake_modeld.requests]
    assert seeds == [2**64 - 1, 0, None, None]  # one choice after another: n=2 starts its second after the first


@pytest.mark.parametrize("n", [0, 17, 2.0, True])
def test_n_out_of_range_is_refused_before_sending(fake_modeld, n):
    with Client(fake_modeld.address) as client, pytest.raises(errors.BadArgument, match="n must be"):
        client.generate_choices("x", n=n)
    assert fake_modeld.requests == []


def test_a_failed_choice_cancels_the_others_and_raises(fake_modeld):
    fake_modeld.pause_after_chunks = 2  # the others would wait 30 s for the client to leave
    fake_modeld.fail_request = ("r-2", grpc.StatusCode.INTERNAL)
    start = time.monotonic()
    with Client(fake_modeld.address) as client, pytest.raises(errors.Internal, match="r-2 failed"):
        client.generate_choices("abcdef", n=4, request_id="r")
    assert time.monotonic() - start < 10
    deadline = time.monotonic() + 5
    while fake_modeld.open_streams and time.monotonic() < deadline:
        time.sleep(0.01)
    assert fake_modeld.open_streams == 0  # every choice's RPC ended: modeld aborts them
    assert fake_modeld.stream_cut.is_set()


def test_async_choices_match_the_blocking_ones(fake_modeld):
    async def scenario():
        async with AsyncClient(fake_modeld.address) as client:
            return await client.generate_choices(input_ids=[72, 105], n=3, seed=1, request_id="a")

    results = asyncio.run(scenario())
    assert [(r.request_id, r.text) for r in results] == [("a", "Hi"), ("a-1", "Hi"), ("a-2", "Hi")]
    seeds = [r.sampling.seed for r in fake_modeld.requests]
    assert seeds[0] == 1 and sorted(seeds[1:]) == [2, 3]


def test_async_failed_choice_cancels_the_others(fake_modeld):
    fake_modeld.pause_after_chunks = 2
    fake_modeld.fail_request = ("s-1", grpc.StatusCode.INTERNAL)

    async def scenario():
        async with AsyncClient(fake_modeld.address) as client:
            await client.generate_choices("abcdef", n=3, request_id="s")

    with pytest.raises(errors.Internal):
        asyncio.run(scenario())
    deadline = time.monotonic() + 5
    while fake_modeld.open_streams and time.monotonic() < deadline:
        time.sleep(0.01)
    assert fake_modeld.open_streams == 0


def test_cli_n_prints_each_choice_in_order(fake_modeld, capsys):
    assert main(["--addr", fake_modeld.address, "generate", "hey", "--n", "2", "--seed", "3", "--json"]) == 0
    results = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["text"] for r in results] == ["hey", "hey"]
    assert sorted(r.sampling.seed for r in fake_modeld.requests) == [3, 4]


def test_cli_refuses_stream_with_several_choices(fake_modeld, capsys):
    assert main(["--addr", fake_modeld.address, "generate", "hey", "--n", "2", "--stream"]) == 1
    assert "--n 1" in capsys.readouterr().err
    assert fake_modeld.requests == []
