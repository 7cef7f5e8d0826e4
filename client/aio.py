"""asyncio client of modeld (grpc.aio): the same surface and rules as client.Client."""

import asyncio
from collections.abc import AsyncIterator

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from client import arguments, errors
from client.choices import choice_count, choice_params
from client.connection import (
    CHANNEL_OPTIONS,
    CONNECTION_PROBE,
    default_modeld_address,
    no_connection_message,
    probe_reached_server,
)
from client.messages import (
    Chunk,
    GenerateResult,
    StreamState,
    build_generate_request,
    proto_to_dict,
    serving_status_name,
)
from client.retry import CallBudget
from protos import modeld_pb2, modeld_pb2_grpc


class AsyncClient:
    """A grpc.aio channel to one modeld; create it inside the event loop that uses it.

    Deadlines, the connection wait, retries and errors follow client.Client. Use as an async
    context manager, or await close().
    """

    def __init__(
        self, address: str | None = None, *, timeout: float = 60.0, connect_timeout: float = 10.0, max_retries: int = 3
    ):
        arguments.call_settings(timeout, connect_timeout, max_retries)
        self.address = address or default_modeld_address()
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.max_retries = max_retries
        self._channel = grpc.aio.insecure_channel(self.address, options=CHANNEL_OPTIONS)
        self._stub = modeld_pb2_grpc.ModeldStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self._connected = False

    async def generate(self, prompt: str | None = None, *, timeout: float | None = None, **params) -> GenerateResult:
        """Run one request to the end and return its result; arguments as for Client.generate."""
        async with self.stream(prompt, timeout=timeout, **params) as handle:
            async for _ in handle:
                pass
            return handle.result

    async def generate_choices(
        self, prompt: str | None = None, *, n: int, timeout: float | None = None, **params
    ) -> list[GenerateResult]:
        """n samples of one prompt, as Client.generate_choices: choice i with seed + i, choices 1..n-1 once choice
        0's first chunk came (its prompt then cached); a failed choice cancels the others and raises."""
        choice_count(n)
        handles = [self.stream(prompt, timeout=timeout, **choice_params(params, i)) for i in range(n)]
        first = aiter(handles[0])
        try:
            await anext(first, None)  # the prompt is in the prefix cache once a token came
            await asyncio.gather(drain(first), *(drain(handle) for handle in handles[1:]))
        except BaseException:
            for handle in handles:  # ends the other choices' RPCs, so that modeld frees their KV
                handle.cancel()
            raise
        return [handle.result for handle in handles]

    def stream(self, prompt: str | None = None, *, timeout: float | None = None, **params) -> "AsyncStreamHandle":
        """Start one request and return its AsyncStreamHandle: `async for` it, then read `.result`."""
        request = build_generate_request(prompt, **params)
        return AsyncStreamHandle(self, request, self._budget(timeout))

    async def abort(self, request_id: str, *, timeout: float | None = None) -> bool:
        """Ask modeld to abort a request; True if it knew the request."""
        arguments.text("request_id", request_id)
        reply = await self._unary(self._stub.Abort, modeld_pb2.AbortRequest(request_id=request_id), timeout)
        return reply.found

    async def info(self, *, timeout: float | None = None) -> dict:
        """modeld's GetInfoResponse as a dict."""
        return proto_to_dict(await self._unary(self._stub.GetInfo, modeld_pb2.GetInfoRequest(), timeout))

    async def capacity(self, *, timeout: float | None = None) -> dict:
        """modeld's Capacity as a dict: "memd" (memd's pools), "running_requests", "waiting_requests"."""
        return proto_to_dict(await self._unary(self._stub.Capacity, modeld_pb2.CapacityRequest(), timeout))

    async def health(self, service: str = "", *, timeout: float | None = None) -> str:
        """grpc.health.v1 status, or the status code name when the check fails (one attempt)."""
        request = health_pb2.HealthCheckRequest(service=service)
        try:
            reply = await self._health.Check(request, timeout=self._budget(timeout).remaining())
        except grpc.RpcError as exc:
            return exc.code().name
        return serving_status_name(reply)

    async def close(self) -> None:
        """Close the channel; calls in flight are cancelled."""
        await self._channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()

    def _budget(self, timeout: float | None) -> CallBudget:
        return CallBudget(self.timeout if timeout is None else timeout, self.max_retries)

    async def _unary(self, method, request, timeout: float | None):
        budget = self._budget(timeout)
        while True:
            await self._wait_until_connected(budget)
            try:
                return await method(request, timeout=budget.remaining())
            except grpc.RpcError as exc:
                delay = budget.retry_delay(exc.code())
                if delay is None:
                    raise errors.from_rpc_error(exc) from exc
            self._connected = False
            await asyncio.sleep(delay)

    async def _wait_until_connected(self, budget: CallBudget) -> None:
        if self._connected:
            return
        wait = min(self.connect_timeout, budget.remaining())
        try:
            await self._health.Check(CONNECTION_PROBE, timeout=wait, wait_for_ready=True)
        except grpc.RpcError as exc:
            if not probe_reached_server(exc):
                raise errors.error_for("UNAVAILABLE", no_connection_message(self.address, wait)) from exc
        self._connected = True


async def drain(chunks) -> None:
    async for _ in chunks:
        pass


class AsyncStreamHandle(StreamState):
    """One Generate stream, as client.client.StreamHandle but for `async for` and `async with`.

    Leaving an `async with` block early cancels the RPC at once; an abandoned iteration is
    cancelled when the event loop finalizes it.
    """

    def __aiter__(self) -> AsyncIterator[Chunk]:
        return self._chunks

    async def __aenter__(self) -> "AsyncStreamHandle":
        return self

    async def __aexit__(self, *exc_info) -> None:
        self.cancel()
        await self._chunks.aclose()

    async def _receive(self) -> AsyncIterator[Chunk]:
        while not self._cancelled:
            await self._client._wait_until_connected(self._budget)
            self._call = self._client._stub.Generate(self._request, timeout=self._budget.remaining())
            if self._cancelled:
                self._call.cancel()
            try:
                async for response in self._call:
                    chunk = self._progress.take(response)
                    if chunk is not None:
                        yield chunk
                self._progress.finish()
                return
            except asyncio.CancelledError:
                if not self._cancelled:
                    raise
                return
            except grpc.RpcError as exc:
                if self._cancelled:
                    return
                delay = None if self._progress.started else self._budget.retry_delay(exc.code())
                if delay is None:
                    raise errors.from_rpc_error(exc) from exc
            finally:
                self._call.cancel()
            self._client._connected = False
            await asyncio.sleep(delay)
