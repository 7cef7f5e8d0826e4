"""AsyncClient against FakeModeld: the same rules as the blocking client, run with asyncio.run."""

import asyncio
import time

import grpc
import pytest

from client import AsyncClient, errors


def run(coroutine_function, *args):
    return asyncio.run(coroutine_function(*args))


def test_generate_returns_the_complete_message(fake_modeld):
    async def scenario():
        async with AsyncClient(fake_modeld.address) as client:
            return await client.generate("hello", max_new_tokens=3)

    result = run(scenario)
    assert (result.text, result.output_ids, result.finish_reason) == ("hel", (104, 101, 108), "length")
    assert (result.prompt_tokens, result.completion_tokens, result.cached_tokens) == (5, 3, 1)
    assert (result.spec_verify_ct, result.spec_accept_length, result.request_id) == (2, 1.5, "fake-1")


def test_stream_yields_chunks_then_holds_the_result(fake_modeld):
    async def scenario():
        async with AsyncClient(fake_modeld.address) as client, client.stream(input_ids=[72, 105]) as handle:
            return [chunk async for chunk in handle], handle.result

    chunks, result = run(scenario)
    assert [chunk.token_ids for chunk in chunks] == [(72,), (105,)]
    assert "".join(chunk.text for chunk in chunks) == result.text == "Hi"
    assert result.finish_reason == "stop"


def test_unavailable_is_retried_until_success(fake_modeld):
    fake_modeld.unavailable_first = 2

    async def scenario():
        async with AsyncClient(fake_modeld.address, max_retries=3) as client:
            return (await client.generate("ok")).text, await client.capacity()

    text, capacity = run(scenario)
    assert text == "ok" and capacity["waiting_requests"] == 1
    assert fake_modeld.attempts["Generate"] == fake_modeld.attempts["Capacity"] == 3


def test_invalid_argument_is_raised_without_retry(fake_modeld):
    async def scenario():
        async with AsyncClient(fake_modeld.address) as client:
            await client.generate("ok", temperature=-1.0)

    with pytest.raises(errors.InvalidArgument):
        run(scenario)
    assert fake_modeld.attempts["Generate"] == 1


def test_half_streamed_generate_is_never_retried(fake_modeld):
    fake_modeld.fail_after_chunks = (1, grpc.StatusCode.UNAVAILABLE)
    received = []

    async def scenario():
        async with AsyncClient(fake_modeld.address) as client, client.stream("hello") as handle:
            async for chunk in handle:
                received.append(chunk.text)

    with pytest.raises(errors.Unavailable):
        run(scenario)
    assert received == ["h"] and fake_modeld.attempts["Generate"] == 1


def test_deadline_exceeded_within_the_timeout(fake_modeld):
    fake_modeld.pause_after_chunks = 0

    async def scenario():
        async with AsyncClient(fake_modeld.address, timeout=0.5) as client:
            await client.generate("hello")

    start = time.monotonic()
    with pytest.raises(errors.DeadlineExceeded):
        run(scenario)
    assert 0.4 < time.monotonic() - start < 1.5


def test_cancel_reaches_the_server_and_ends_the_stream_quietly(fake_modeld):
    fake_modeld.pause_after_chunks = 1

    async def scenario():
        async with AsyncClient(fake_modeld.address) as client, client.stream("hello") as handle:
            texts = []
            async for chunk in handle:
                texts.append(chunk.text)
                handle.cancel()
            cut = await asyncio.to_thread(fake_modeld.stream_cut.wait, 5)
            return texts, handle.result, cut

    assert run(scenario) == (["h"], None, True)


def test_leaving_the_async_with_block_early_cancels(fake_modeld):
    fake_modeld.pause_after_chunks = 1

    async def scenario():
        async with AsyncClient(fake_modeld.address) as client:
            async with client.stream("hello") as handle:
                async for _ in handle:
                    break
            return await asyncio.to_thread(fake_modeld.stream_cut.wait, 5)

    assert run(scenario)


def test_abort_info_capacity_health(fake_modeld):
    async def scenario():
        async with AsyncClient(fake_modeld.address) as client:
            await client.generate("x", request_id="mine")
            return (
                await client.abort("mine"),
                await client.abort("other"),
                await client.info(),
                await client.capacity(),
                await client.health(),
            )

    found, not_found, info, capacity, health = run(scenario)
    assert (found, not_found, fake_modeld.aborted) == (True, False, ["mine", "other"])
    assert info["target_tokens"] == 1 << 40 and capacity["memd"]["target"]["total"] == 1000
    assert health == "SERVING"


def test_unreachable_server(nowhere):
    async def scenario():
        async with AsyncClient(nowhere, connect_timeout=0.3) as client:
            assert await client.health() == "UNAVAILABLE"
            await client.info()

    start = time.monotonic()
    with pytest.raises(errors.Unavailable, match="could not connect"):
        run(scenario)
    assert time.monotonic() - start < 2
