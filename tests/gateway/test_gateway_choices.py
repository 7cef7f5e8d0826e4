"""n > 1 through the gateway and the real daemons (CPU, the default model): n choices from one prompt, each a
request of its own on one modeld with its own seed (seed + i), answering in OpenAI's shape whole and streamed. The
prompt is computed once: choices 1..n-1 start after choice 0's first token, and memd's prefix cache serves them its
prompt (modeld's cached-prompt counter rises by about the prompt for each)."""

import json
import uuid

from tests.gateway.streams import OpenStream
from tests.gateway.test_metrics_scrape import modeld_totals

N = 4
CACHED = "modeld:prefix_cache_hit_tokens_total"


def fresh_question() -> list[dict]:
    """A prompt memd's prefix cache cannot hold yet."""
    return [{"role": "user", "content": f"Write a short line about the number {uuid.uuid4().int % 10**9}."}]


def test_n_choices_share_one_prefill_and_each_samples_its_own_seed(stack, openai_client, model_name):
    messages = fresh_question()
    before = modeld_totals(stack, [CACHED])[CACHED]
    sampled = dict(model=model_name, messages=messages, temperature=1.0, max_tokens=12, seed=11)
    answer = openai_client.chat.completions.create(n=N, **sampled)
    cached = modeld_totals(stack, [CACHED])[CACHED] - before
    assert [c.index for c in answer.choices] == list(range(N))
    assert all(c.message.content and c.finish_reason in ("stop", "length") for c in answer.choices)
    assert len({c.message.content for c in answer.choices}) > 1, "the choices did not sample their own seeds"
    usage = answer.usage
    alone = openai_client.chat.completions.create(**sampled)  # choice 0 alone: seed 11, the same prompt
    assert alone.choices[0].message.content == answer.choices[0].message.content
    assert usage.prompt_tokens == alone.usage.prompt_tokens  # the prompt counts once
    assert usage.prompt_tokens_details.cached_tokens == 0  # nothing held it before this request
    assert usage.completion_tokens == sum(completion_tokens(openai_client, sampled))
    # choices 1..n-1 found choice 0's prompt in memd's prefix cache (all but its last partial page)
    assert cached >= (N - 1) * (usage.prompt_tokens - 16), (cached, usage.prompt_tokens)


def completion_tokens(openai_client, sampled: dict) -> list[int]:
    """Each choice's completion tokens, asked one at a time with its seed (seed + i)."""
    return [
        openai_client.chat.completions.create(**{**sampled, "seed": sampled["seed"] + i}).usage.completion_tokens
        for i in range(N)
    ]


def test_n_choices_stream_interleaved_by_index(stack, model_name):
    body = dict(model=model_name, messages=fresh_question(), temperature=0, max_tokens=8, n=2)
    stream = OpenStream(stack.url, "/v1/chat/completions", body)
    assert stream.status == 200
    events, finished = [], []
    while len(finished) < 2:
        event = stream.events(1)[0]
        events.append(event)
        finished += [c["index"] for c in event["choices"] if c["finish_reason"]]
    stream.close()
    assert sorted(finished) == [0, 1]
    text = {0: "", 1: ""}
    for event in events:
        for choice in event["choices"]:
            text[choice["index"]] += choice["delta"].get("content", "")
    assert text[0] and text[0] == text[1]  # greedy: both choices answer alike
    assert json.dumps(events[0]["choices"][0]["delta"]) == json.dumps({"role": "assistant", "content": ""})
