"""The client refuses arguments no server could take (a wrong type, a value its field cannot carry, an impossible
combination) with its own error, client.BadArgument (an InvalidArgument and a ValueError) naming the argument, before
anything is sent; what the values mean stays modeld's to judge."""

import asyncio

import numpy as np
import pytest

from client import AsyncClient, BadArgument, Client, InvalidArgument
from client.__main__ import main

BAD_GENERATE_ARGUMENTS = [
    (dict(prompt="hi", max_new_tokens=2**31), "max_new_tokens must be in [-2147483648, 2147483647], got 2147483648"),
    (dict(prompt="hi", max_tokens=1.5), "max_tokens must be an integer, got float"),
    (dict(prompt="hi", top_k=True), "top_k must be an integer, got bool"),
    (dict(prompt="hi", seed=-1), "seed must be in [0, 18446744073709551615], got -1"),
    (dict(prompt="hi", seed=2**64), "got 18446744073709551616"),
    (dict(prompt="hi", temperature="hot"), "temperature must be a number, got str"),
    (dict(prompt="hi", top_p=[0.5]), "top_p must be a number, got list"),
    (dict(prompt=b"hi"), "prompt must be a str, got bytes"),
    (dict(prompt="\ud800"), "prompt is not valid Unicode: surrogates not allowed at character 0"),
    (dict(input_ids=[1, 2**31]), "input_ids[1] must be in [-2147483648, 2147483647], got 2147483648"),
    (dict(input_ids="abc"), "input_ids must be a sequence of integers, got str"),
    (dict(input_ids=[1, "2"]), "input_ids[1] must be an integer, got str"),
    (dict(prompt="hi", stop=[1]), "stop[0] must be a str, got int"),
    (dict(prompt="hi", stop=7), "stop must be a str or a sequence of str, got int"),
    (dict(prompt="hi", stop_token_ids=[-(2**31) - 1]), "stop_token_ids[0] must be in"),
    (dict(prompt="hi", ignore_eos="yes"), "ignore_eos must be True or False, got 'yes'"),
    (dict(prompt="hi", request_id=5), "request_id must be a str, got int"),
    (dict(prompt="hi", input_ids=[1]), "give exactly one of prompt, input_ids and messages"),
    (dict(input_ids=[1], chat=True), "chat applies to a text prompt only"),
]


@pytest.mark.parametrize("kwargs,message", BAD_GENERATE_ARGUMENTS)
def test_bad_generate_arguments_raise_bad_argument_before_sending(fake_modeld, kwargs, message):
    with Client(fake_modeld.address) as client:
        for call in (client.generate, client.stream):
            with pytest.raises(BadArgument) as refused:
                call(**kwargs)
            assert message in refused.value.message
            assert isinstance(refused.value, ValueError) and isinstance(refused.value, InvalidArgument)
            assert refused.value.code == "INVALID_ARGUMENT"
    assert fake_modeld.attempts["Generate"] == 0


def test_the_async_client_refuses_the_same_way(fake_modeld):
    async def scenario():
        async with AsyncClient(fake_modeld.address) as client:
            with pytest.raises(BadArgument, match="max_new_tokens must be in"):
                await client.generate("hi", max_new_tokens=2**40)
            with pytest.raises(BadArgument, match="request_id must be a str"):
                await client.abort(None)

    asyncio.run(scenario())
    assert fake_modeld.attempts["Generate"] == fake_modeld.attempts["Abort"] == 0


@pytest.mark.parametrize(
    "settings,message",
    [
        (dict(timeout=-1), "timeout must be > 0, got -1"),
        (dict(timeout=0), "timeout must be > 0, got 0"),
        (dict(timeout=float("nan")), "timeout must be > 0, got nan"),
        (dict(connect_timeout="5"), "connect_timeout must be a number, got str"),
        (dict(max_retries=-1), "max_retries must be in [0, 2147483647], got -1"),
        (dict(max_retries=2.0), "max_retries must be an integer, got float"),
    ],
)
@pytest.mark.parametrize("client_class", [Client, AsyncClient])
def test_bad_client_settings_raise_bad_argument(client_class, settings, message):
    with pytest.raises(BadArgument) as refused:
        client_class("unix:///nonexistent/modeld.sock", **settings)
    assert message in refused.value.message


def test_a_bad_per_call_timeout_or_abort_id_is_refused_before_sending(fake_modeld):
    with Client(fake_modeld.address) as client:
        with pytest.raises(BadArgument, match="timeout must be > 0, got -2"):
            client.info(timeout=-2)
        with pytest.raises(BadArgument, match="request_id must be a str, got bytes"):
            client.abort(b"r1")
    assert fake_modeld.attempts["GetInfo"] == fake_modeld.attempts["Abort"] == 0


def test_numpy_values_and_generators_are_taken(fake_modeld):
    with Client(fake_modeld.address) as client:
        client.generate(
            input_ids=np.array([72, 105]),
            max_new_tokens=np.int64(2),
            temperature=np.float32(0.5),
            stop_token_ids=np.array([3], np.int32),
            seed=np.uint64(7),
        )
        client.generate(input_ids=(i for i in [72, 105]), stop=(s for s in ["a"]), stop_token_ids=iter([3]))
    first, second = fake_modeld.requests
    assert list(first.input_ids.ids) == [72, 105] and first.sampling.max_new_tokens == 2
    assert first.sampling.seed == 7 and list(first.sampling.stop_token_ids) == [3]
    assert list(second.input_ids.ids) == [72, 105] and list(second.sampling.stop) == ["a"]
    assert list(second.sampling.stop_token_ids) == [3]


def test_the_cli_prints_the_refusal_like_a_server_error(fake_modeld, capsys):
    assert main(["--addr", fake_modeld.address, "generate", "hi", "--max-new-tokens", str(2**31)]) == 1
    assert capsys.readouterr().err == (
        "error: INVALID_ARGUMENT: max_new_tokens must be in [-2147483648, 2147483647], got 2147483648\n"
    )
    assert fake_modeld.attempts["Generate"] == 0
