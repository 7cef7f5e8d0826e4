"""How a conversation with functions reaches the chat template (modeld.front.tool_turns): a template without tools
gets the functions and the call's form in the system message and earlier calls as JSON content; one with tools gets
them as its arguments; bad tools and calls are refused naming the field."""

import json
import re
from types import SimpleNamespace

import pytest

from modeld.front.tool_turns import CALL_FORM, template_turns
from modeld.sampling_params import InvalidRequest

TOOLS = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
CALL = [{"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": '{"city": "Oslo"}'}}]


def message(role: str, content: str = "", tool_calls: str = "", tool_call_id: str = ""):
    return SimpleNamespace(role=role, content=content, tool_calls=tool_calls, tool_call_id=tool_call_id)


def test_a_template_without_tools_reads_them_in_the_system_message():
    messages = [
        message("user", "time?"),
        message("assistant", tool_calls=json.dumps(CALL)),
        message("tool", "9:00", tool_call_id="call_1"),
    ]
    turns, tools = template_turns(messages, json.dumps(TOOLS), template_takes_tools=False)
    assert tools is None
    assert (
        turns[0]["role"] == "system"
        and '"name": "get_time"' in turns[0]["content"]
        and CALL_FORM in turns[0]["content"]
    )
    assert json.loads(turns[2]["content"]) == {"name": "get_time", "arguments": {"city": "Oslo"}}
    assert turns[3] == {"role": "tool", "content": "9:00", "tool_call_id": "call_1"}
    with_system = template_turns([message("system", "Be brief."), message("user", "hi")], json.dumps(TOOLS), False)[0]
    assert with_system[0]["content"].startswith("Be brief.\n\n") and len(with_system) == 2


def test_a_template_with_tools_gets_them_and_the_calls_as_it_expects():
    messages = [message("user", "time?"), message("assistant", tool_calls=json.dumps(CALL))]
    turns, tools = template_turns(messages, json.dumps(TOOLS), template_takes_tools=True)
    assert tools == TOOLS and turns[0]["role"] == "user"
    assert turns[1]["tool_calls"] == [
        {"type": "function", "function": {"name": "get_time", "arguments": {"city": "Oslo"}}}
    ]


@pytest.mark.parametrize(
    "tools, calls, error",
    [
        ("{nope", "", "tools is not JSON"),
        ("[]", "", "tools must be a non-empty JSON list"),
        ('[{"type": "function"}]', "", "tools[0] must be"),
        (json.dumps(TOOLS), '[{"function": {}}]', "messages[1].tool_calls is not OpenAI's tool_calls list"),
    ],
)
def test_bad_tools_and_calls_are_refused(tools, calls, error):
    with pytest.raises(InvalidRequest, match=re.escape(error)):
        template_turns([message("user", "hi"), message("assistant", tool_calls=calls)], tools, False)
