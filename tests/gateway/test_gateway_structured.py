"""Structured outputs and log probabilities through the gateway with the official `openai` package (tests/gateway's
stack): response_format json_schema, json_object and regex, schema-valid answers whole and streamed; chat logprobs
with top_logprobs in OpenAI's shape, equal to the modeld client's; the legacy completions' logprobs; and the
refusals of a bad schema and of top_logprobs beyond 20, as 400s naming the field."""

import json

import jsonschema
import openai
import pytest

from tests.modeld.grammar.schemas import SCHEMAS

PERSON = SCHEMAS["person"][0]
ASK = [{"role": "user", "content": "Describe a person as JSON."}]


def schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}


def test_json_schema_answer_whole_and_streamed(openai_client, model_name):
    whole = openai_client.chat.completions.create(
        model=model_name, messages=ASK, temperature=0, max_tokens=80, response_format=schema_format(PERSON)
    )
    content = whole.choices[0].message.content
    jsonschema.validate(json.loads(content), PERSON)
    assert whole.choices[0].finish_reason == "stop"
    events = openai_client.chat.completions.create(
        model=model_name,
        messages=ASK,
        temperature=0,
        max_tokens=80,
        response_format=schema_format(PERSON),
        stream=True,
    )
    assert "".join(e.choices[0].delta.content or "" for e in events if e.choices) == content


def test_json_object_and_regex(openai_client, model_name):
    question = [{"role": "user", "content": 'What is the capital of France? Answer as {"answer": "..."}'}]
    obj = openai_client.chat.completions.create(
        model=model_name, messages=question, temperature=0, max_tokens=80, response_format={"type": "json_object"}
    )
    assert isinstance(json.loads(obj.choices[0].message.content), dict)
    code = openai_client.completions.create(
        model=model_name,
        prompt="A product code:",
        temperature=0.9,
        seed=1,
        max_tokens=16,
        extra_body={"response_format": {"type": "regex", "regex": "[A-Z]{3}[0-9]{2}"}},
    )
    text = code.choices[0].text
    assert len(text) == 5 and text[:3].isupper() and text[3:].isdigit(), text


def test_chat_logprobs_in_openai_shape(openai_client, model_name, stack):
    reply = openai_client.chat.completions.create(
        model=model_name, messages=ASK, temperature=0, max_tokens=8, logprobs=True, top_logprobs=3
    )
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens
    assert "".join(entry.token for entry in content).startswith(reply.choices[0].message.content)
    direct = stack.clients[0].generate(messages=ASK, temperature=0, max_new_tokens=8, logprobs=True, top_logprobs=3)
    for entry, ours in zip(content, direct.logprobs):
        assert entry.token == ours.token and entry.logprob == pytest.approx(ours.logprob, abs=1e-4)
        assert entry.bytes == list(ours.token.encode())
        assert [top.token for top in entry.top_logprobs] == [top.token for top in ours.top]
        assert entry.top_logprobs[0].logprob >= entry.logprob - 1e-6  # greedy: the chosen token is the likeliest
    streamed = openai_client.chat.completions.create(
        model=model_name, messages=ASK, temperature=0, max_tokens=8, logprobs=True, top_logprobs=3, stream=True
    )
    tokens = [
        entry.token for e in streamed if e.choices and e.choices[0].logprobs for entry in e.choices[0].logprobs.content
    ]
    assert tokens == [entry.token for entry in content]


def test_completion_logprobs_in_the_legacy_shape(openai_client, model_name):
    reply = openai_client.completions.create(
        model=model_name, prompt="1, 2, 3,", temperature=0, max_tokens=6, logprobs=2
    )
    logprobs = reply.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 6
    assert logprobs.text_offset == [sum(len(t) for t in logprobs.tokens[:i]) for i in range(6)]
    assert all(
        len(top) == 2 and max(top.values()) >= lp - 1e-6
        for top, lp in zip(logprobs.top_logprobs, logprobs.token_logprobs)
    )


@pytest.mark.parametrize(
    "change, param",
    [
        (dict(response_format=schema_format({"type": "frobnicate"})), None),  # modeld's compiler: INVALID_ARGUMENT
        (dict(logprobs=True, top_logprobs=21), "top_logprobs"),
        (dict(top_logprobs=2), "top_logprobs"),  # without logprobs
    ],
)
def test_bad_structured_requests_are_400(openai_client, model_name, change, param):
    with pytest.raises(openai.BadRequestError) as refused:
        openai_client.chat.completions.create(model=model_name, messages=ASK, max_tokens=8, **change)
    assert refused.value.status_code == 400
    if param is not None:
        assert refused.value.body["param"] == param
    else:
        assert "frobnicate" in refused.value.body["message"]
