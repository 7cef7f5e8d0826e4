"""n > 1 through the client library (Client.generate_choices) against the real daemons of the gateway's stack (CPU,
the default model): choice i samples as a lone request with seed + i does, and choices 1..n-1 find choice 0's
prompt in memd's prefix cache. The autouse fixture checks memd idle and its pools free afterwards."""

import asyncio
import uuid

import client

N = 3


def test_choices_sample_their_own_seeds_and_share_one_prefill(stack):
    c = stack.clients[0]
    prompt = f"Write a short line about the number {uuid.uuid4().int % 10**9}."
    sampled = dict(chat=True, temperature=1.0, max_new_tokens=10, seed=21)
    results = c.generate_choices(prompt, n=N, **sampled)
    assert results[0].cached_tokens == 0  # a prompt nothing held before
    for result in results[1:]:
        assert result.prompt_tokens == results[0].prompt_tokens
        assert result.cached_tokens >= result.prompt_tokens - 16, result  # all but a last partial page
    alone = [c.generate(prompt, **{**sampled, "seed": 21 + i}) for i in range(N)]
    assert [r.output_ids for r in results] == [r.output_ids for r in alone]
    assert len({r.output_ids for r in results}) > 1, "the choices did not sample their own seeds"


def test_async_choices_equal_the_blocking_ones(stack):
    prompt = f"Name a colour and the number {uuid.uuid4().int % 10**9}."
    sampled = dict(chat=True, temperature=1.0, max_new_tokens=8, seed=3)

    async def scenario():
        async with client.AsyncClient(stack.modelds[1].address, timeout=30) as c:
            return await c.generate_choices(prompt, n=N, **sampled)

    results = asyncio.run(scenario())
    blocking = stack.clients[1].generate_choices(prompt, n=N, **sampled)
    assert [r.output_ids for r in results] == [r.output_ids for r in blocking]
    assert all(r.cached_tokens >= r.prompt_tokens - 16 for r in blocking)  # the async run cached the prompt
