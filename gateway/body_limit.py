"""The request body, bounded in size and in time, before any route sees it (an ASGI middleware).

A declared Content-Length over the bound is refused before the body is read; a body without one
(chunked) or with a false one is counted as it arrives and refused as soon as it passes the bound. Either way the
gateway holds at most the bound (plus uvicorn's read buffer: it stops reading the socket past 64 KiB) for one
request. The whole body must arrive within the timeout, counted from the end of the headers: a client that
trickles its body cannot hold a request open for longer.

A refusal is answered at once in OpenAI's error shape (413 too large, 408 too slow) with `Connection: close`: the rest
of the body is never read, so the connection cannot carry another request."""

import asyncio

from fastapi.responses import JSONResponse

from gateway.errors import error_body

TOO_LARGE, TOO_SLOW = 413, 408


class Refused(Exception):
    """A body the gateway will not read: the HTTP status, the message and OpenAI's error code to answer with."""

    def __init__(self, status: int, message: str, code: str):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


class ClientLeft(Exception):
    """The client disconnected before its body was complete: nobody is left to answer."""


class BodyLimit:
    def __init__(self, app, max_bytes: int, timeout: float):
        self.app, self.max_bytes, self.timeout = app, max_bytes, timeout

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            self._check_declared(scope)
            body = await asyncio.wait_for(self._read(receive), self.timeout)
        except asyncio.TimeoutError:
            await refuse(
                Refused(TOO_SLOW, f"the request body did not arrive within {self.timeout:g} s", "request_timeout"),
                scope,
                receive,
                send,
            )
            return
        except Refused as refusal:
            await refuse(refusal, scope, receive, send)
            return
        except ClientLeft:
            return
        await self.app(scope, replay(body, receive), send)

    def _check_declared(self, scope) -> None:
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                raise Refused(
                    TOO_LARGE, f"the request body is {int(value)} bytes: at most {self.max_bytes}", "request_too_large"
                )

    async def _read(self, receive) -> bytes:
        """The whole body; reading stops at the first message that takes it past the bound."""
        parts, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientLeft
            part = message.get("body", b"")
            size += len(part)
            if size > self.max_bytes:
                raise Refused(
                    TOO_LARGE,
                    f"the request body is larger than {self.max_bytes} bytes, the gateway's limit",
                    "request_too_large",
                )
            parts.append(part)
            if not message.get("more_body", False):
                return b"".join(parts)


def replay(body: bytes, receive):
    """The ASGI receive the app gets: the body read already, in one message, then the connection's own messages
    (the route's disconnect watch reads http.disconnect from there)."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive_again():
        return pending.pop() if pending else await receive()

    return receive_again


async def refuse(refusal: Refused, scope, receive, send) -> None:
    response = JSONResponse(
        error_body(refusal.message, "invalid_request_error", code=refusal.code),
        status_code=refusal.status,
        headers={"connection": "close"},
    )
    await response(scope, receive, send)
