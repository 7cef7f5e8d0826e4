"""One OpenAI request end to end: pick a modeld, start its Generate stream, answer whole or as server-sent events.

The stream's first message is awaited before the HTTP answer starts, so a refusal (bad input, no room, modeld
gone) still gets its HTTP status. A client that disconnects cancels the Generate stream, which aborts the request
in modeld and frees its KV in memd."""

import logging
import math
import time
import uuid
from contextlib import AsyncExitStack

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


async def generate(
    request: Request, backends: Backends, router: Router, body: ChatRequest | CompletionRequest, chat: bool
) -> Response:
    body.check_supported()
    backend = choose_backend(backends, router, body)
    request_id = uuid.uuid4().hex
    shaper = Shaper(chat, request_id, body.model)
    stack = AsyncExitStack()
    streaming = False  # once the SSE body runs, it closes the stack
    try:
        await unless_disconnected(request, backend.admission.enter())  # queued while the modeld's places are full
        entered = time.monotonic()
        stack.callback(lambda: backend.admission.leave(time.monotonic() - entered))
        handle = await stack.enter_async_context(
            backend.client.stream(request_id=request_id, **body.generate_arguments())
        )
        chunks = aiter(handle)
        if not body.stream:
            await unless_disconnected(request, drain(chunks))
            return JSONResponse(shaper.complete(handle.result), headers=routed_to(backend))
        first = await unless_disconnected(request, anext(chunks, None))
        events = stream_events(shaper, handle, chunks, first, body.include_usage, stack)
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


async def drain(chunks) -> None:
    async for _ in chunks:
        pass


async def stream_events(shaper: Shaper, handle, chunks, first, include_usage: bool, stack: AsyncExitStack):
    """The SSE body; its end (the last event, an error, or a disconnect cancelling it) closes the Generate stream."""
    try:
        opening = shaper.opening()
        if opening is not None:
            yield opening
        chunk = first
        while chunk is not None:
            if chunk.text:
                yield shaper.piece(chunk.text)
            chunk = await anext(chunks, None)
        yield shaper.finish(handle.result)
        if include_usage:
            yield shaper.usage_event(handle.result)
        yield DONE
    except ClientError as exc:  # after the answer started: the error is the stream's last event
        api_error = from_client_error(exc, retry_after=1)
        yield sse(error_body(api_error.message, api_error.kind, api_error.code))
    finally:
        await stack.aclose()


def routed_to(backend) -> dict[str, str]:
    """Which modeld answered, by its position among the gateway's --modeld flags (not its address)."""
    return {"x-modeld-index": str(backend.index)}
