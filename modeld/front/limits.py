"""modeld's bounds on a Generate request, all in one place; past one, the request is refused with INVALID_ARGUMENT
before any work (the prompt is not tokenized), and a message past MAX_REQUEST_BYTES is refused by gRPC itself
(RESOURCE_EXHAUSTED) before it is parsed."""

from collections.abc import Sequence

from modeld.sampling_params import InvalidRequest

MAX_REQUEST_BYTES = 64 << 20  # gRPC receive bound: the text of a 128k-token context at 512 bytes a token
MAX_REQUEST_ID_BYTES = 256  # memd bounds the ids it is sent (modeld's request ids) the same (memd.limits)
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256
MAX_STOP_TOKEN_IDS = 256
# A prompt's text may be at most this many times the tokenizer's longest token (in UTF-8 bytes) per token of the
# context. No token stands for more text than the longest, so a text over the bound cannot fit the context and is
# refused before the tokenizer runs; the factor leaves room for normalizers that shorten a text before it is split
# (Unicode NFC composing a character from its parts).
TEXT_BYTES_PER_LONGEST_TOKEN = 2
# Chat messages of one request, whatever the context: a conversation longer than this is not a chat. Below it,
# a request may have at most as many messages as empty turns fit its context (chat_turn_tokens).
MAX_CHAT_MESSAGES = 4096


def check_request_id(rid: str) -> None:
    """At most MAX_REQUEST_ID_BYTES of printable characters: request ids appear in logs and errors as they are."""
    if len(rid) > MAX_REQUEST_ID_BYTES or len(rid.encode()) > MAX_REQUEST_ID_BYTES:  # len(str) <= bytes: cheap first
        raise InvalidRequest(f"request_id is {len(rid.encode())} bytes: at most {MAX_REQUEST_ID_BYTES}")
    if not rid.isprintable():
        raise InvalidRequest("request_id must be printable: no control characters (newlines, tabs, escapes)")


def text_bytes_per_token(tokenizer) -> int:
    """The bound on a prompt's UTF-8 bytes per token of the context, for this tokenizer."""
    longest = max(len(tokenizer.convert_tokens_to_string([token]).encode()) for token in tokenizer.get_vocab())
    return TEXT_BYTES_PER_LONGEST_TOKEN * longest


def chat_turn_tokens(tokenizer) -> int:
    """The fewest tokens a turn adds to a conversation: what one more empty user turn costs in the chat template
    (at least 1: no template renders a turn as nothing)."""

    def length(turns: int) -> int:
        messages = [{"role": "user", "content": ""}] * turns
        return len(tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False))

    try:
        return max(1, length(2) - length(1))
    except (ValueError, TypeError, AttributeError):  # no chat template (or one that refuses empty turns)
        return 1


def check_message_count(count: int, context_len: int, turn_tokens: int) -> None:
    """Before any message is read: more turns than fit the context cannot be answered, and rendering them would
    hold a worker for as long as they are many."""
    limit = min(MAX_CHAT_MESSAGES, max(1, context_len // turn_tokens))
    if count > limit:
        raise InvalidRequest(
            f"{count} messages: at most {limit} (a turn takes at least {turn_tokens} tokens of the "
            f"context of {context_len}; at most {MAX_CHAT_MESSAGES} in any context)"
        )


def check_text_size(text: str, context_len: int, bytes_per_token: int) -> None:
    limit = context_len * bytes_per_token
    if len(text) > limit or len(text.encode()) > limit:  # len(str) <= its bytes: cheap first
        raise InvalidRequest(
            f"the prompt text is {len(text.encode())} bytes: at most {limit} for the context of "
            f"{context_len} tokens ({bytes_per_token} bytes per token)"
        )


def check_stops(stop: Sequence[str], stop_token_ids: Sequence[int]) -> None:
    """Counts first: a request's stop lists are bounded before they are copied."""
    if len(stop) > MAX_STOP_STRINGS:
        raise InvalidRequest(f"{len(stop)} stop strings: at most {MAX_STOP_STRINGS}")
    long = next((s for s in stop if len(s) > MAX_STOP_STRING_CHARS), None)
    if long is not None:
        raise InvalidRequest(f"a stop string is {len(long)} characters: at most {MAX_STOP_STRING_CHARS}")
    if len(stop_token_ids) > MAX_STOP_TOKEN_IDS:
        raise InvalidRequest(f"{len(stop_token_ids)} stop_token_ids: at most {MAX_STOP_TOKEN_IDS}")
