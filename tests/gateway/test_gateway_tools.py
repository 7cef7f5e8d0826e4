"""Function calling through the gateway with the official `openai` package (tests/gateway's stack): a required call
and a named one come back as OpenAI's tool_calls with arguments that satisfy the function's schema, whole and
streamed; a round trip (the call's result sent back as a tool message) gets an answer; the choice's refusals; and
how an answer is read as a call (gateway.tools)."""

import json

import jsonschema
import openai
import pytest

from gateway.tools import CallPieces, Tool, constraint_for, read_call

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather now in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 32},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time now in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 32}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def call_of(reply) -> tuple[str, dict]:
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    return call.function.name, json.loads(call.function.arguments)


def test_a_required_call_satisfies_its_schema_whole_and_streamed(openai_client, model_name):
    arguments = dict(model=model_name, messages=ASK, tools=[WEATHER], tool_choice="required", temperature=0)
    name, args = call_of(openai_client.chat.completions.create(max_tokens=64, **arguments))
    assert name == "get_weather"
    jsonschema.validate(args, WEATHER["function"]["parameters"])
    events = list(openai_client.chat.completions.create(max_tokens=64, stream=True, **arguments))
    calls = [e.choices[0].delta.tool_calls[0] for e in events if e.choices and e.choices[0].delta.tool_calls]
    assert len(calls) > 2, "the call did not stream in pieces"
    assert calls[0].index == 0 and calls[0].id.startswith("call_") and calls[0].function.name == name
    assert json.loads("".join(call.function.arguments or "" for call in calls)) == args
    assert [e.choices[0].finish_reason for e in events if e.choices][-1] == "tool_calls"


def test_a_named_function_is_the_one_called(openai_client, model_name):
    reply = openai_client.chat.completions.create(
        model=model_name,
        messages=ASK,
        tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        temperature=0,
        max_tokens=64,
    )
    name, args = call_of(reply)
    assert name == "get_time"
    jsonschema.validate(args, TIME["function"]["parameters"])


def test_a_round_trip_answers_from_the_tool_result(openai_client, model_name):
    first = openai_client.chat.completions.create(
        model=model_name, messages=ASK, tools=[WEATHER], tool_choice="required", temperature=0, max_tokens=64
    )
    call = first.choices[0].message.tool_calls[0]
    conversation = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 21, "sky": "clear"})},
    ]
    answer = openai_client.chat.completions.create(
        model=model_name, messages=conversation, tools=[WEATHER], temperature=0, max_tokens=32
    )
    choice = answer.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    assert choice.message.content or choice.message.tool_calls
    assert answer.usage.prompt_tokens > first.usage.prompt_tokens  # the call and its result are in the prompt


@pytest.mark.parametrize(
    "change, param",
    [
        (dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice"),
        (dict(tool_choice="required"), "tool_choice"),
        (dict(tools=[WEATHER], response_format={"type": "json_object"}), "response_format"),
    ],
)
def test_bad_tool_requests_are_400(openai_client, model_name, change, param):
    with pytest.raises(openai.BadRequestError) as refused:
        openai_client.chat.completions.create(model=model_name, messages=ASK, max_tokens=8, **change)
    assert refused.value.body["param"] == param


def test_an_answer_is_a_call_only_when_it_parses_as_one():
    tools = [Tool.model_validate(WEATHER)]
    (call,) = read_call('{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}', tools)
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Oslo", "unit": "celsius"}'}
    for text in ("It is sunny.", '{"name": "other", "arguments": {}}', '{"name": "get_weather", "arguments": 3}'):
        assert read_call(text, tools) is None
    assert constraint_for(tools, "auto") == {} and constraint_for(tools, "none") == {}
    required = constraint_for(tools, "required")["json_schema"]
    assert required["properties"]["name"] == {"const": "get_weather"}


def test_a_forced_call_streams_its_arguments_as_they_come():
    answer = '{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}'
    pieces = CallPieces()
    deltas = [delta for i in range(0, len(answer), 3) for delta in pieces.feed(answer[i : i + 3])] + pieces.finish()
    assert deltas[0]["function"] == {"name": "get_weather", "arguments": ""} and deltas[0]["id"].startswith("call_")
    assert "".join(d["function"]["arguments"] for d in deltas) == '{"city": "Oslo", "unit": "celsius"}'
    assert all("id" not in d for d in deltas[1:]) and len(deltas) > 3
    cut = CallPieces()  # an answer cut at max_tokens keeps what it had
    assert cut.feed('{"name": "f", "arguments": {"a": 1') and cut.finish() == [
        {"index": 0, "function": {"arguments": "1"}}
    ]
