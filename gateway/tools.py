"""Function calling (OpenAI's tools): the functions, the choice among them, the constraint a call is generated under,
and the call read back from the answer.

A call is one JSON object {"name": ..., "arguments": {...}}, the form modeld's chat rendering asks for where the
model's template has no tools of its own (modeld.front.tool_turns). With tool_choice "required" or a named function
the answer is constrained to that form, the arguments to the function's parameter schema, so the call always parses,
its arguments satisfy the schema, and it streams as it comes (CallPieces); with "auto" the answer is free, and it is
a call when it parses as one (streamed whole once it ended)."""

import json
import re
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


def forces_call(choice: ToolChoice | None) -> bool:
    """The answer is constrained to a call (so it can stream as one before it ends)."""
    return choice == "required" or isinstance(choice, NamedChoice)


CALL_HEAD = re.compile(r'\{"name": ?"([^"]+)", ?"arguments": ?(?=\S)')  # complete once the arguments begin


class CallPieces:
    """A forced call's stream deltas as its text arrives. The answer is {"name": ..., "arguments": ...} with the name
    first (the constraint's property order), so once that head is complete the rest, but for the wrapper's closing
    brace, is the arguments' JSON: the first delta names the function, the next ones carry the arguments' text as
    OpenAI streams it. The last character is held back until the end (it may be that brace)."""

    def __init__(self):
        self.text, self.sent = "", 0
        self.named = False

    def feed(self, piece: str) -> list[dict]:
        self.text += piece
        deltas = []
        if not self.named:
            head = CALL_HEAD.match(self.text)
            if head is None:
                return []
            self.named, self.sent = True, head.end()
            function = {"name": head.group(1), "arguments": ""}
            deltas.append({"index": 0, "id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": function})
        held = len(self.text) - 1
        if held > self.sent:
            deltas.append({"index": 0, "function": {"arguments": self.text[self.sent : held]}})
            self.sent = held
        return deltas

    def finish(self) -> list[dict]:
        """The arguments' last piece: what is left without the wrapper's closing brace (an answer cut at max_tokens
        keeps what it had)."""
        if not self.named:
            return []
        end = len(self.text) - 1 if self.text.endswith("}") else len(self.text)
        rest, self.sent = self.text[self.sent : end], end
        return [{"index": 0, "function": {"arguments": rest}}] if rest else []
