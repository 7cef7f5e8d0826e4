"""A conversation with functions (OpenAI's tools) as the chat template's input. A template that takes tools gets them
and the assistant's calls as it expects them; one that does not (the default model's) gets the functions described
in the system message, with the form a call takes: one JSON object {"name": ..., "arguments": {...}}, the form the
gateway constrains and parses a call by (gateway.tools), and the assistant's earlier calls in that form as its
content."""

import json

from modeld.sampling_params import InvalidRequest

CALL_FORM = (
    'To call a function, answer with one JSON object and nothing else: {"name": <function name>, "arguments": '
    "<its arguments as a JSON object>}."
)


def parse_tools(text: str) -> list[dict]:
    """OpenAI's tools list from its JSON; InvalidRequest naming what is wrong."""
    try:
        tools = json.loads(text)
    except ValueError as exc:
        raise InvalidRequest(f"tools is not JSON: {exc}") from None
    if not isinstance(tools, list) or not tools:
        raise InvalidRequest("tools must be a non-empty JSON list")
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if (
            not isinstance(function, dict)
            or tool.get("type") != "function"
            or not isinstance(function.get("name"), str)
        ):
            raise InvalidRequest(f'tools[{i}] must be {{"type": "function", "function": {{"name": ..., ...}}}}')
    return tools


def parse_calls(text: str, index: int) -> list[dict]:
    """An assistant message's tool_calls from their JSON: [{"function": {"name", "arguments" (a JSON string)}}]."""
    try:
        calls = json.loads(text)
        return [
            {"name": call["function"]["name"], "arguments": json.loads(call["function"].get("arguments") or "{}")}
            for call in calls
        ]
    except (ValueError, TypeError, KeyError) as exc:
        raise InvalidRequest(f"messages[{index}].tool_calls is not OpenAI's tool_calls list: {exc}") from None


def template_turns(messages, tools_text: str, template_takes_tools: bool) -> tuple[list[dict], list[dict] | None]:
    """The template's messages and its tools argument (None: the functions are in the system message)."""
    tools = parse_tools(tools_text) if tools_text else None
    turns = []
    for i, m in enumerate(messages):
        turn = {"role": m.role, "content": m.content}
        if m.tool_calls:
            calls = parse_calls(m.tool_calls, i)
            if template_takes_tools:
                turn["tool_calls"] = [{"type": "function", "function": call} for call in calls]
            else:
                turn["content"] = "\n".join(json.dumps(call) for call in calls)
        if m.tool_call_id:
            turn["tool_call_id"] = m.tool_call_id
        turns.append(turn)
    if tools is None or template_takes_tools:
        return turns, tools
    described = "You can call these functions:\n" + json.dumps([t["function"] for t in tools]) + "\n" + CALL_FORM
    if turns and turns[0]["role"] == "system":
        turns[0] = {**turns[0], "content": turns[0]["content"] + "\n\n" + described}
    else:
        turns.insert(0, {"role": "system", "content": described})
    return turns, None
