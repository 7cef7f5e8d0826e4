"""Waiting for something unless the HTTP client goes away first."""

import asyncio

from starlette.requests import Request


class ClientGone(Exception):
    """The HTTP client disconnected before the answer was ready."""


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, awaitable):
    """The awaitable's result; if the client disconnects first, the awaitable is cancelled (and has ended) and
    ClientGone is raised."""
    work = asyncio.ensure_future(awaitable)
    gone = asyncio.create_task(_disconnected(request))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not work.done():
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
    if work.cancelled():
        raise ClientGone
    return work.result()
