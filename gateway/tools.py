"""Function calling (OpenAI's tools): the functions, the choice among them, the constraint a call is generated under,
and the call read back from the answer.

A call is one JSON object {"name": ..., "arguments": {...}}, the form modeld's chat rendering asks for where the
model's template has no tools of its own (modeld.front.tool_turns). With tool_choice "required" or a named function
the answer is constrained to that form, the arguments to the function's parameter schema, so the call always parses
and its arguments satisfy the schema; with "auto" the answer is free, and it is a call when it parses as one."""

import json
import uuid
from typing import Literal

from pydantic import BaseModel, Field

from gateway.errors import ApiError

NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"  # OpenAI's function names
ANY_OBJECT = {"type": "object"}


class Function(BaseModel):
    name: str = Field(pattern=NAME_PATTERN)
    description: str = ""
    parameters: dict = Field(default_factory=lambda: dict(ANY_OBJECT))


class Tool(BaseModel):
    type: Literal["function"]
    function: Function


class NamedFunction(BaseModel):
    name: str


class NamedChoice(BaseModel):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedChoice


def call_schema(function: Function) -> dict:
    return {
        "type": "object",
        "properties": {"name": {"const": function.name}, "arguments": function.parameters},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def constraint_for(tools: list[Tool], choice: ToolChoice) -> dict:
    """The client library's constraint for the answer: a call of the named function, or of any ("required"); none
    for "auto" and "none"."""
    if isinstance(choice, NamedChoice):
        named = next((t.function for t in tools if t.function.name == choice.function.name), None)
        if named is None:
            raise ApiError(
                400, f"tool_choice names {choice.function.name!r}, which is not in tools", param="tool_choice"
            )
        return {"json_schema": call_schema(named)}
    if choice == "required":
        schemas = [call_schema(t.function) for t in tools]
        return {"json_schema": schemas[0] if len(schemas) == 1 else {"anyOf": schemas}}
    return {}


def read_call(text: str, tools: list[Tool]) -> list[dict] | None:
    """The answer as OpenAI's tool_calls (one call), or None when it is not a call of one of the functions."""
    try:
        call = json.loads(text)
    except ValueError:
        return None
    names = {t.function.name for t in tools}
    if not isinstance(call, dict) or call.get("name") not in names or not isinstance(call.get("arguments"), dict):
        return None
    return [
        {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])},
        }
    ]
