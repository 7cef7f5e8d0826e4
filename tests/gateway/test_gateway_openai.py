"""The official `openai` package against the gateway (tests/gateway/conftest.py's stack): chat and text completions,
streaming, stop strings, usage with cached tokens, models, health, errors with their HTTP codes, and a client that
disconnects mid-stream (its request is aborted in modeld and memd holds nothing afterwards)."""

import json
import time
import urllib.request

import openai
import pytest

from tests.gateway.streams import OpenStream

GREEDY = dict(temperature=0, max_tokens=12)
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_chat_completion(openai_client, model_name):
    reply = openai_client.chat.completions.create(model=model_name, messages=QUESTION, **GREEDY)
    assert reply.object == "chat.completion" and reply.model == model_name
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and "Paris" in choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert reply.usage.prompt_tokens > 5 and 0 < reply.usage.completion_tokens <= 12
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_streaming_equals_whole_answer(openai_client, model_name):
    whole = openai_client.chat.completions.create(model=model_name, messages=QUESTION, **GREEDY)
    events = list(
        openai_client.chat.completions.create(
            model=model_name, messages=QUESTION, stream=True, stream_options={"include_usage": True}, **GREEDY
        )
    )
    assert events[0].choices[0].delta.role == "assistant"
    text = "".join(e.choices[0].delta.content or "" for e in events if e.choices)
    assert text == whole.choices[0].message.content
    assert [e.choices[0].finish_reason for e in events if e.choices][-1] == whole.choices[0].finish_reason
    assert events[-1].choices == [] and events[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_text_completion_with_stop_and_system_prompt(openai_client, model_name):
    free = openai_client.completions.create(model=model_name, prompt="1, 2, 3, 4,", **GREEDY)
    assert free.object == "text_completion" and free.choices[0].text
    stop = free.choices[0].text.strip()[:1]
    stopped = openai_client.completions.create(model=model_name, prompt="1, 2, 3, 4,", stop=[stop], **GREEDY)
    assert stopped.choices[0].finish_reason == "stop" and stop not in stopped.choices[0].text
    chat = openai_client.chat.completions.create(
        model=model_name, **GREEDY, messages=[{"role": "system", "content": "Answer in one word."}, *QUESTION]
    )
    assert chat.choices[0].message.content


def test_repeated_prompt_reports_cached_tokens(openai_client, model_name):
    messages = [{"role": "user", "content": "Repeat after me: the quick brown fox jumps over the lazy dog."}]
    first = openai_client.chat.completions.create(model=model_name, messages=messages, **GREEDY)
    again = openai_client.chat.completions.create(model=model_name, messages=messages, **GREEDY)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert again.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 2
    assert again.choices[0].message.content == first.choices[0].message.content


def test_models_and_health(openai_client, model_name, stack):
    assert [m.id for m in openai_client.models.list()] == [model_name]
    with urllib.request.urlopen(f"{stack.url}/health", timeout=10) as health:
        assert health.status == 200 and json.load(health)["modelds"] == 2


@pytest.mark.parametrize(
    "change, status, param",
    [
        (dict(model="no-such-model"), 404, "model"),
        (dict(n=17), 400, "n"),  # above MAX_CHOICES
        (dict(n=0), 400, "n"),
        (dict(temperature=-1), 400, "temperature"),
        (dict(max_tokens=100_000), 400, None),  # modeld: beyond the context
    ],
)
def test_errors_in_openai_shape(openai_client, model_name, change, status, param):
    request = dict(model=model_name, messages=QUESTION, **GREEDY) | change
    with pytest.raises(openai.APIStatusError) as caught:
        openai_client.chat.completions.create(**request)
    assert caught.value.status_code == status
    error = caught.value.body
    assert error["message"] and error["type"] and error["param"] == param


def test_disconnect_mid_stream_aborts_the_request(stack, model_name):
    body = dict(
        model=model_name,
        messages=[{"role": "user", "content": "Tell me a very long story."}],
        max_tokens=2000,
        temperature=0,
    )
    stream = OpenStream(stack.url, "/v1/chat/completions", body)
    assert stream.status == 200
    assert stream.events(4)[0]["object"] == "chat.completion.chunk"
    assert sum(c.info()["running_requests"] for c in stack.clients) == 1
    stream.close()  # the client goes away mid-stream
    deadline = time.monotonic() + 10
    while any(c.info()["running_requests"] for c in stack.clients) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(c.info()["running_requests"] for c in stack.clients)
    stack.memd.wait_idle(5)
