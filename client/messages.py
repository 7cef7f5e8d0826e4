"""Request building and reply parsing shared by the sync and async clients."""

import dataclasses
from collections.abc import Iterator, Mapping, Sequence

from grpc_health.v1 import health_pb2

from client import arguments, errors
from protos import modeld_pb2


@dataclasses.dataclass(frozen=True)
class TopLogprob:
    token_id: int
    token: str  # its text alone
    logprob: float


@dataclasses.dataclass(frozen=True)
class TokenLogprob:
    """An output token's log probability (after temperature and constraint) and, with top_logprobs, its position's
    most likely tokens, most likely first (tokens a constraint forbids left out)."""

    token_id: int
    token: str  # its text alone (a token that splits a UTF-8 character decodes to U+FFFD)
    logprob: float
    top: tuple[TopLogprob, ...] = ()


@dataclasses.dataclass(frozen=True)
class Chunk:
    """Tokens a Generate stream produced since the previous chunk, the text they add, and their log probabilities
    (empty unless the request asked for logprobs)."""

    token_ids: tuple[int, ...]
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclasses.dataclass(frozen=True)
class GenerateResult:
    """The complete message of a Generate stream.

    finish_reason is "stop", "length" or "abort"; matched_stop is "" when no stop string matched;
    spec_accept_length is completion_tokens / spec_verify_ct (bonus token included), without the tokens of decode
    steps that verified no block (speculation off while the batch is large); 0 without speculation.
    """

    text: str
    output_ids: tuple[int, ...]
    finish_reason: str
    matched_stop: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    spec_verify_ct: int
    spec_accept_length: float
    request_id: str
    logprobs: tuple[TokenLogprob, ...] = ()  # one per output id, when the request asked for logprobs


def build_generate_request(
    prompt: str | None = None,
    *,
    input_ids: Sequence[int] | None = None,
    messages: Sequence[Mapping[str, str]] | None = None,
    max_new_tokens: int | None = None,
    max_tokens: int | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    seed: int | None = None,
    stop: str | Sequence[str] | None = None,
    stop_token_ids: Sequence[int] | None = None,
    ignore_eos: bool = False,
    chat: bool = False,
    request_id: str | None = None,
    json_schema: Mapping | str | None = None,
    regex: str | None = None,
    json_object: bool = False,
    logprobs: bool = False,
    top_logprobs: int | None = None,
    tools: Sequence[Mapping] | str | None = None,
) -> modeld_pb2.GenerateRequest:
    """The GenerateRequest for these arguments; unset sampling values take modeld's defaults.

    Give exactly one of `prompt` (text), `input_ids` (token ids) and `messages` (a conversation: dicts with
    "role" and "content", rendered by modeld's chat template). `max_tokens` is an alias of
    `max_new_tokens`. `chat` wraps a text prompt as one user turn with the model's chat template.
    `request_id` empty or None lets modeld assign one. At most one constraint on the output: `json_schema` (a
    schema as a dict or its JSON text), `regex`, or `json_object` (any JSON object). `logprobs` asks for each output
    token's log probability, `top_logprobs` (0-20) for its position's most likely tokens too. `tools` (OpenAI's
    tools list, or its JSON) go with `messages` to the chat template; messages may then carry an assistant's
    "tool_calls" and a tool's "tool_call_id". Raises errors.BadArgument (a ValueError) for argument
    combinations that no server could accept and for values of the wrong type or beyond what their field carries
    (client.arguments); what the values mean is checked by modeld (INVALID_ARGUMENT).
    """
    if sum(value is not None for value in (prompt, input_ids, messages)) != 1:
        raise errors.BadArgument("give exactly one of prompt, input_ids and messages")
    if max_new_tokens is not None and max_tokens is not None:
        raise errors.BadArgument("max_tokens is an alias of max_new_tokens: give at most one")
    if chat and prompt is None:
        raise errors.BadArgument("chat applies to a text prompt only")
    if tools is not None and messages is None:
        raise errors.BadArgument("tools go with messages")
    if sum((json_schema is not None, regex is not None, bool(json_object))) > 1:
        raise errors.BadArgument("give at most one of json_schema, regex and json_object")
    # A one-shot iterator (a generator) is read once, here: the checks and the message then see the same values.
    input_ids, stop, stop_token_ids = (
        list(values) if isinstance(values, Iterator) else values for values in (input_ids, stop, stop_token_ids)
    )
    if messages is not None:
        messages = arguments.chat_messages(messages)
    arguments.check_generate(
        prompt=prompt,
        input_ids=input_ids,
        max_new_tokens=max_new_tokens,
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        seed=seed,
        stop=stop,
        stop_token_ids=stop_token_ids,
        ignore_eos=ignore_eos,
        chat=chat,
        request_id=request_id,
        regex=regex,
        json_object=json_object,
        logprobs=logprobs,
        top_logprobs=top_logprobs,
    )
    sampling = modeld_pb2.SamplingParams(
        max_new_tokens=max_new_tokens,
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        seed=seed,
        stop=[stop] if isinstance(stop, str) else stop,
        stop_token_ids=stop_token_ids,
        ignore_eos=ignore_eos,
        logprobs=logprobs,
        top_logprobs=top_logprobs,
    )
    request = modeld_pb2.GenerateRequest(request_id=request_id or "", apply_chat_template=chat, sampling=sampling)
    if json_schema is not None:
        schema = json_schema if isinstance(json_schema, str) else arguments.json_text("json_schema", json_schema)
        request.constraint.json_schema = schema
    elif regex is not None:
        request.constraint.regex = regex
    elif json_object:
        request.constraint.json_object = True
    if prompt is not None:
        request.text = prompt
    elif messages is not None:
        tools_text = tools if tools is None or isinstance(tools, str) else arguments.json_text("tools", list(tools))
        request.messages.CopyFrom(
            modeld_pb2.ChatMessages(messages=[modeld_pb2.ChatMessage(**m) for m in messages], tools=tools_text)
        )
    else:
        request.input_ids.CopyFrom(modeld_pb2.TokenIds(ids=input_ids))
    return request


def logprobs_of(messages) -> tuple[TokenLogprob, ...]:
    return tuple(
        TokenLogprob(m.token_id, m.token, m.logprob, tuple(map(TopLogprob, m.top_ids, m.top_tokens, m.top_logprobs)))
        for m in messages
    )


class GenerateProgress:
    """What one Generate stream has delivered so far: whether anything arrived, its id, its result."""

    def __init__(self):
        self.started = False
        self.request_id = ""
        self.result: GenerateResult | None = None

    def take(self, response: modeld_pb2.GenerateResponse) -> Chunk | None:
        """Record one stream message; return its Chunk, or None for the complete message."""
        self.started = True
        self.request_id = response.request_id
        if response.HasField("complete"):
            self.result = result_from_complete(response.request_id, response.complete)
            return None
        chunk = response.chunk
        return Chunk(tuple(chunk.token_ids), chunk.text, logprobs_of(chunk.logprobs))

    def finish(self) -> GenerateResult:
        """The result, once the stream has ended; INTERNAL if it ended without a complete message."""
        if self.result is None:
            raise errors.error_for("INTERNAL", "the Generate stream ended without a complete message")
        return self.result


def result_from_complete(request_id: str, complete: modeld_pb2.GenerateComplete) -> GenerateResult:
    """The GenerateResult holding a GenerateComplete's fields."""
    return GenerateResult(
        text=complete.text,
        output_ids=tuple(complete.output_ids),
        finish_reason=modeld_pb2.FinishReason.Name(complete.finish_reason).lower(),
        matched_stop=complete.matched_stop,
        prompt_tokens=complete.prompt_tokens,
        completion_tokens=complete.completion_tokens,
        cached_tokens=complete.cached_tokens,
        spec_verify_ct=complete.spec_verify_ct,
        spec_accept_length=complete.spec_accept_length,
        request_id=request_id,
        logprobs=logprobs_of(complete.logprobs),
    )


def proto_to_dict(message) -> dict:
    """Every field of a message by its proto name, unset ones included; int64 values stay ints."""
    return {field.name: field_value(field, getattr(message, field.name)) for field in message.DESCRIPTOR.fields}


def field_value(field, value):
    """A field's value as plain Python: dicts for messages and maps, lists for repeated fields."""
    if field.message_type is None:
        return list(value) if field.is_repeated else value
    if field.message_type.GetOptions().map_entry:
        value_field = field.message_type.fields_by_name["value"]
        return {key: field_value(value_field, item) for key, item in value.items()}
    if field.is_repeated:
        return [proto_to_dict(item) for item in value]
    return proto_to_dict(value)


def serving_status_name(reply: health_pb2.HealthCheckResponse) -> str:
    """SERVING, NOT_SERVING, SERVICE_UNKNOWN or UNKNOWN."""
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


class StreamState:
    """What the sync and asyncio stream handles share: the request, its deadline, the progress
    of the stream, and cancellation. Subclasses provide `_receive()` (the chunk iterator)."""

    def __init__(self, client, request: modeld_pb2.GenerateRequest, budget):
        self._client = client
        self._request = request
        self._budget = budget
        self._progress = GenerateProgress()
        self._call = None
        self._cancelled = False
        self._chunks = self._receive()

    @property
    def result(self) -> "GenerateResult | None":
        """The complete message's fields; None until the stream has ended."""
        return self._progress.result

    @property
    def request_id(self) -> str:
        """modeld's id for the request; "" before the first message."""
        return self._progress.request_id

    def cancel(self) -> None:
        """Cancel the RPC (safe from any thread, and after the end); the iteration then ends
        quietly with `result` None."""
        self._cancelled = True
        if self._call is not None:
            self._call.cancel()
