"""Checks of the client's arguments before anything is sent: their types, and the ranges their fields can carry
(32-bit integers, an unsigned 64-bit seed). What the values mean (a temperature >= 0, a prompt that fits the context)
is modeld's to check. Every refusal is an errors.BadArgument naming the argument."""

import json
import operator
from collections.abc import Iterable, Mapping
from numbers import Real

from client.errors import BadArgument

INT32 = (-(2**31), 2**31 - 1)
MESSAGE_KEYS = {"role", "content", "tool_calls", "tool_call_id"}
UINT64 = (0, 2**64 - 1)


def integer(name: str, value, bounds: tuple[int, int] = INT32) -> None:
    """An int (or anything with __index__, such as a numpy integer; not a bool) within bounds."""
    try:
        if isinstance(value, bool):
            raise TypeError
        number = operator.index(value)
    except TypeError:
        raise BadArgument(f"{name} must be an integer, got {type(value).__name__}") from None
    if not bounds[0] <= number <= bounds[1]:
        raise BadArgument(f"{name} must be in [{bounds[0]}, {bounds[1]}], got {number}")


def integers(name: str, values, bounds: tuple[int, int] = INT32) -> None:
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise BadArgument(f"{name} must be a sequence of integers, got {type(values).__name__}")
    for i, value in enumerate(values):
        integer(f"{name}[{i}]", value, bounds)


def uint64(name: str, value) -> None:
    integer(name, value, UINT64)


def number(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise BadArgument(f"{name} must be a number, got {type(value).__name__}")


def positive(name: str, value) -> None:
    number(name, value)
    if not value > 0:
        raise BadArgument(f"{name} must be > 0, got {value}")


def text(name: str, value) -> None:
    """A str that UTF-8 can carry (no lone surrogates)."""
    if not isinstance(value, str):
        raise BadArgument(f"{name} must be a str, got {type(value).__name__}")
    try:
        value.encode()
    except UnicodeEncodeError as exc:
        raise BadArgument(f"{name} is not valid Unicode: {exc.reason} at character {exc.start}") from None


def texts(name: str, values) -> None:
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise BadArgument(f"{name} must be a str or a sequence of str, got {type(values).__name__}")
    for i, value in enumerate(values):
        text(f"{name}[{i}]", value)


def flag(name: str, value) -> None:
    if value not in (True, False):
        raise BadArgument(f"{name} must be True or False, got {value!r}")


def chat_messages(values) -> list[dict[str, str]]:
    """A conversation: a sequence of mappings with a str "role" and "content", and for function calling an
    assistant's "tool_calls" (OpenAI's list, or its JSON) or a tool message's "tool_call_id" (other keys refused);
    returns it as plain dicts of strings, read once."""
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Iterable):
        raise BadArgument(f"messages must be a sequence of {{'role', 'content'}} mappings, got {type(values).__name__}")
    turns = []
    for i, message in enumerate(values):
        if not isinstance(message, Mapping) or not {"role", "content"} <= set(message) <= MESSAGE_KEYS:
            raise BadArgument(
                f"messages[{i}] must be a mapping with the keys 'role' and 'content' (and 'tool_calls' or "
                "'tool_call_id')"
            )
        turn = {key: message[key] for key in message}
        if not isinstance(turn.get("tool_calls", ""), str):
            turn["tool_calls"] = json_text(f"messages[{i}].tool_calls", turn["tool_calls"])
        for key, value in turn.items():
            text(f"messages[{i}].{key}", value)
        turns.append(turn)
    return turns


def json_text(name: str, value) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise BadArgument(f"{name} is not JSON-serialisable: {exc}") from None


def call_settings(timeout, connect_timeout, max_retries) -> None:
    """A client's deadline, connection wait and retries."""
    positive("timeout", timeout)
    positive("connect_timeout", connect_timeout)
    integer("max_retries", max_retries, (0, INT32[1]))


def check_generate(
    *,
    prompt,
    input_ids,
    max_new_tokens,
    max_tokens,
    temperature,
    top_p,
    top_k,
    seed,
    stop,
    stop_token_ids,
    ignore_eos,
    chat,
    request_id,
    regex=None,
    json_object=False,
    logprobs=False,
    top_logprobs=None,
) -> None:
    """client.messages.build_generate_request's arguments; None is unset."""
    checks = [
        (text, "prompt", prompt),
        (integers, "input_ids", input_ids),
        (integer, "max_new_tokens", max_new_tokens),
        (integer, "max_tokens", max_tokens),
        (number, "temperature", temperature),
        (number, "top_p", top_p),
        (integer, "top_k", top_k),
        (uint64, "seed", seed),
        (texts, "stop", [stop] if isinstance(stop, str) else stop),
        (integers, "stop_token_ids", stop_token_ids),
        (flag, "ignore_eos", ignore_eos),
        (flag, "chat", chat),
        (text, "request_id", request_id),
        (text, "regex", regex),
        (flag, "json_object", json_object),
        (flag, "logprobs", logprobs),
        (integer, "top_logprobs", top_logprobs),
    ]
    for check, name, value in checks:
        if value is not None:
            check(name, value)
