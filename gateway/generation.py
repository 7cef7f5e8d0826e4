"""One OpenAI request end to end: pick a modeld, start its Generate streams (one a choice), answer whole or as
server-sent events.

Each stream's first message is awaited before the HTTP answer starts, so a refusal (bad input, no room, modeld
gone) still gets its HTTP status. With n > 1 every choice goes to the same modeld, and choices 1..n-1 start once
choice 0's first token came: its prompt is computed then, and memd's prefix cache serves it to the others, so the
prompt is computed once. A client that disconnects cancels the Generate streams, which aborts the requests in
modeld and frees their KV in memd."""

import asyncio
import logging
import math
import time
import uuid
from contextlib import AsyncExitStack
from dataclasses import dataclass

from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import Request

from client.errors import ClientError
from gateway.admission import QueueFull
from gateway.backends import Backends
from gateway.disconnect import ClientGone, unless_disconnected
from gateway.errors import ApiError, error_body, from_client_error
from gateway.responses import DONE, Shaper, sse
from gateway.router import Router
from gateway.schemas import ChatRequest, CompletionRequest
from gateway.tools import CallPieces, forces_call

log = logging.getLogger("gateway")
CLIENT_CLOSED = 499  # the HTTP client went away (nginx's convention); nobody reads it


def choose_backend(backends: Backends, router: Router, body: ChatRequest | CompletionRequest):
    candidates = backends.serving(body.model)
    if candidates:
        return router.pick(body.affinity_key(), candidates)
    if backends.known_model(body.model):
        raise ApiError(
            503,
            f"no modeld serving {body.model!r} is ready now (none answers SERVING to its health check)",
            "service_unavailable",
            code="unavailable",
            retry_after=math.ceil(backends.poll_interval),  # a poll may find one serving again
        )
    raise ApiError(
        404,
        f"the model {body.model!r} does not exist; served: {', '.join(backends.models()) or 'none'}",
        code="model_not_found",
        param="model",
    )


@dataclass
class Choice:
    handle: object  # the client library's stream handle: `.result` once it ended
    chunks: object  # its async iterator of chunks, after the first
    first: object  # the first chunk (None: the stream ended without one)


async def generate(
    request: Request, backends: Backends, router: Router, body: ChatRequest | CompletionRequest, chat: bool
) -> Response:
    body.check_supported()
    backend = choose_backend(backends, router, body)
    request_id = uuid.uuid4().hex
    tools = body.tools if chat and body.calls_tools else None
    shaper = Shaper(
        chat,
        request_id,
        body.model,
        logprobs=body.top_logprobs_asked() is not None,
        tools=tools,
        forced_call=tools is not None and forces_call(body.tool_choice),
    )
    stack = AsyncExitStack()
    streaming = False  # once the SSE body runs, it closes the stack
    try:
        choices = [await open_choice(request, backend, body, request_id, 0, stack)]
        others = await asyncio.gather(
            *(open_choice(request, backend, body, request_id, i, stack) for i in range(1, body.n)),
            return_exceptions=True,  # every one opened or failed: the stack closes those that opened
        )
        failed = next((other for other in others if isinstance(other, BaseException)), None)
        if failed is not None:
            raise failed
        choices += others
        if not body.stream:
            await unless_disconnected(request, asyncio.gather(*(drain(choice.chunks) for choice in choices)))
            return JSONResponse(shaper.complete([c.handle.result for c in choices]), headers=routed_to(backend))
        events = stream_events(shaper, choices, body.include_usage, stack)
        streaming = True
        return StreamingResponse(events, media_type="text/event-stream", headers=routed_to(backend))
    except QueueFull as exc:
        raise ApiError(
            429,
            f"modeld {backend.index} is at capacity: {exc}; retry after {exc.retry_after} s",
            "rate_limit_error",
            code="queue_full",
            retry_after=exc.retry_after,
        ) from None
    except ClientGone:
        log.info("request %s: the client disconnected; aborted in modeld %s", request_id, backend.address)
        return Response(status_code=CLIENT_CLOSED)
    except ClientError as exc:
        if exc.code == "UNAVAILABLE":
            backend.refused_unavailable()
        raise from_client_error(exc, backend.admission.retry_after()) from exc
    finally:
        if not streaming:
            await stack.aclose()


async def open_choice(request: Request, backend, body, request_id: str, index: int, stack: AsyncExitStack) -> Choice:
    """Choice `index`'s Generate stream, once the modeld's admission lets it in (queued while its places are full),
    and its first chunk; the stack leaves the admission and closes the stream."""
    await unless_disconnected(request, backend.admission.enter())
    entered = time.monotonic()
    stack.callback(lambda: backend.admission.leave(time.monotonic() - entered))
    handle = await stack.enter_async_context(
        backend.client.stream(
            request_id=request_id if index == 0 else f"{request_id}-{index}", **body.generate_arguments(index)
        )
    )
    chunks = aiter(handle)
    return Choice(handle, chunks, await unless_disconnected(request, anext(chunks, None)))


async def drain(chunks) -> None:
    async for _ in chunks:
        pass


async def choice_events(shaper: Shaper, index: int, choice: Choice):
    """One choice's events after its opening: its text as it comes, then its finish (with tools: the whole answer
    once it ended, content or call)."""
    if shaper.tools and shaper.forced_call:
        async for event in call_events(shaper, index, choice):
            yield event
        return
    if shaper.tools:
        await drain(choice.chunks)
        for event in shaper.whole_answer(choice.handle.result, index):
            yield event
        return
    chunk = choice.first
    while chunk is not None:
        if chunk.text or chunk.logprobs:
            yield shaper.piece(chunk.text, index, chunk.logprobs)
        chunk = await anext(choice.chunks, None)
    yield shaper.finish(choice.handle.result, index)


async def call_events(shaper: Shaper, index: int, choice: Choice):
    """A forced call's events as its text comes (gateway.tools.CallPieces), then its finish."""
    pieces, logprobs = CallPieces(), ()
    chunk = choice.first
    while chunk is not None:
        logprobs += chunk.logprobs
        for delta in pieces.feed(chunk.text):
            yield shaper.call_piece(delta, index, logprobs)
            logprobs = ()
        chunk = await anext(choice.chunks, None)
    for delta in pieces.finish():
        yield shaper.call_piece(delta, index, logprobs)
        logprobs = ()
    result = choice.handle.result
    yield shaper.finish(result, index, "tool_calls" if result.finish_reason == "stop" else result.finish_reason)


async def merged_events(shaper: Shaper, choices: list[Choice]):
    """Every choice's events as they come (one choice: in order, without a task)."""
    if len(choices) == 1:
        async for event in choice_events(shaper, 0, choices[0]):
            yield event
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, choice: Choice) -> None:
        try:
            async for event in choice_events(shaper, index, choice):
                await queue.put(event)
        except ClientError as exc:
            await queue.put(exc)
        finally:
            await queue.put(None)

    tasks = [asyncio.create_task(pump(index, choice)) for index, choice in enumerate(choices)]
    try:
        ended = 0
        while ended < len(choices):
            event = await queue.get()
            if event is None:
                ended += 1
            elif isinstance(event, ClientError):
                raise event
            else:
                yield event
    finally:
        for task in tasks:
            task.cancel()


async def stream_events(shaper: Shaper, choices: list[Choice], include_usage: bool, stack: AsyncExitStack):
    """The SSE body; its end (the last event, an error, or a disconnect cancelling it) closes the Generate streams."""
    try:
        for index in range(len(choices)):
            opening = shaper.opening(index)
            if opening is not None:
                yield opening
        async for event in merged_events(shaper, choices):
            yield event
        if include_usage:
            yield shaper.usage_event([choice.handle.result for choice in choices])
        yield DONE
    except ClientError as exc:  # after the answer started: the error is the stream's last event
        api_error = from_client_error(exc, retry_after=1)
        yield sse(error_body(api_error.message, api_error.kind, api_error.code))
    finally:
        await stack.aclose()


def routed_to(backend) -> dict[str, str]:
    """Which modeld answered, by its position among the gateway's --modeld flags (not its address)."""
    return {"x-modeld-index": str(backend.index)}
