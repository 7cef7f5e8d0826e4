"""modeld's front prepares a Generate (checks, chat template, tokenizing) on a worker thread beside its event loop,
so that one large request never holds up health checks or the other streams; a conversation of more turns than fit
the context is refused before any message is read."""

import asyncio
import threading
import time
from types import SimpleNamespace

import pytest
from transformers import AutoTokenizer

from modeld.front.limits import MAX_CHAT_MESSAGES, check_message_count
from modeld.front.service import ModeldService
from modeld.sampling_params import InvalidRequest
from protos import modeld_pb2

CONTEXT = 1024


def chat(turns: int) -> modeld_pb2.GenerateRequest:
    return modeld_pb2.GenerateRequest(
        messages=modeld_pb2.ChatMessages(messages=[modeld_pb2.ChatMessage(role="user", content="hi")] * turns),
        sampling=modeld_pb2.SamplingParams(max_new_tokens=4),
    )


@pytest.fixture(scope="module")
def engine(default_model):
    return SimpleNamespace(
        tokenizer=AutoTokenizer.from_pretrained(default_model), vocab_size=49152, context_len=CONTEXT
    )


def test_a_request_is_prepared_off_the_loop_while_the_loop_runs_on(engine):
    async def run():
        service = ModeldService(engine, "127.0.0.1:1", 8)
        build, threads, ticks = service._build, [], 0

        def slow_build(request):  # a prompt that takes a while to render and tokenize
            threads.append(threading.get_ident())
            time.sleep(0.5)
            return build(request)

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        service._build = slow_build
        beside = asyncio.create_task(ticker())
        req = await service.prepared(chat(3))
        beside.cancel()
        service.prepare.shutdown()
        return threading.get_ident(), threads, ticks, req

    loop_thread, threads, ticks, req = asyncio.run(run())
    assert threads and threads[0] != loop_thread
    assert ticks >= 10  # the loop went on while the request was prepared (about 50 ticks; 1 if it had waited)
    assert req.prompt_ids and req.params.max_new_tokens == 4


def test_more_turns_than_fit_the_context_are_refused_before_they_are_read(engine):
    async def run(turns: int):
        service = ModeldService(engine, "127.0.0.1:1", 8)
        try:
            return await service.prepared(chat(turns))
        finally:
            service.prepare.shutdown()

    assert asyncio.run(run(CONTEXT // 5 // 2)).prompt_ids  # SmolLM2's empty user turn is 5 tokens
    start = time.monotonic()
    with pytest.raises(InvalidRequest, match=f"100000 messages: at most {CONTEXT // 5} "):
        asyncio.run(run(100_000))
    assert time.monotonic() - start < 1.0


def test_the_message_bound():
    check_message_count(204, 1024, 5)
    with pytest.raises(InvalidRequest, match="205 messages: at most 204"):
        check_message_count(205, 1024, 5)
    with pytest.raises(InvalidRequest, match=f"at most {MAX_CHAT_MESSAGES} "):
        check_message_count(MAX_CHAT_MESSAGES + 1, 1 << 20, 1)
    check_message_count(1, 3, 5)  # a context shorter than a turn still takes one message
