"""Blocking client of modeld: generate, stream, abort, info, capacity, health."""

import time
from collections.abc import Iterator
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

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


class Client:
    """A channel to one modeld.

    Deadlines: `timeout` is the default deadline of a call, all its attempts together (for a
    stream, from stream() to its last message); every method's `timeout` overrides it.
    Connection: on its first call, and after an UNAVAILABLE, the client waits up to
    `connect_timeout` for modeld to be reachable, else raises Unavailable.
    Retries: UNAVAILABLE is retried up to `max_retries` times after 0.1 s, 0.2 s, 0.4 s, ...,
    never once a Generate stream has delivered a message.
    Errors: client.errors.ClientError subclasses. Use as a context manager, or call close().
    """

    def __init__(
        self, address: str | None = None, *, timeout: float = 60.0, connect_timeout: float = 10.0, max_retries: int = 3
    ):
        arguments.call_settings(timeout, connect_timeout, max_retries)
        self.address = address or default_modeld_address()
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.max_retries = max_retries
        self._channel = grpc.insecure_channel(self.address, options=CHANNEL_OPTIONS)
        self._stub = modeld_pb2_grpc.ModeldStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self._connected = False

    def generate(self, prompt: str | None = None, *, timeout: float | None = None, **params) -> GenerateResult:
        """Run one request to the end and return its result. `params` are those of
        client.messages.build_generate_request (input_ids, max_new_tokens, temperature, stop, ...)."""
        with self.stream(prompt, timeout=timeout, **params) as handle:
            for _ in handle:
                pass
            return handle.result

    def generate_choices(
        self, prompt: str | None = None, *, n: int, timeout: float | None = None, **params
    ) -> list[GenerateResult]:
        """n samples of one prompt (OpenAI's `n`), their results in order: choice i samples with seed + i, and
        choices 1..n-1 start once choice 0's first chunk came, so that memd's prefix cache serves them its prompt
        (their `cached_tokens`). Arguments as for generate(); if any choice fails, the others are cancelled and its
        error is raised."""
        choice_count(n)
        handles = [self.stream(prompt, timeout=timeout, **choice_params(params, i)) for i in range(n)]
        first = iter(handles[0])
        pool = ThreadPoolExecutor(max_workers=n)
        try:
            next(first, None)  # the prompt is in the prefix cache once a token came
            ends = [pool.submit(drain, first)] + [pool.submit(drain, handle) for handle in handles[1:]]
            for end in wait(ends, return_when=FIRST_EXCEPTION).done:
                end.result()
        except BaseException:
            for handle in handles:  # ends the other choices' RPCs, so that modeld frees their KV
                handle.cancel()
            raise
        finally:
            pool.shutdown()
        return [handle.result for handle in handles]

    def stream(self, prompt: str | None = None, *, timeout: float | None = None, **params) -> "StreamHandle":
        """Start one request and return its StreamHandle: iterate it for Chunk items, then read `.result`.
        Arguments as for generate(); errors.BadArgument (a ValueError) for impossible ones, before anything is sent."""
        request = build_generate_request(prompt, **params)
        return StreamHandle(self, request, self._budget(timeout))

    def abort(self, request_id: str, *, timeout: float | None = None) -> bool:
        """Ask modeld to abort a request; True if it knew the request."""
        arguments.text("request_id", request_id)
        reply = self._unary(self._stub.Abort, modeld_pb2.AbortRequest(request_id=request_id), timeout)
        return reply.found

    def info(self, *, timeout: float | None = None) -> dict:
        """modeld's GetInfoResponse (models, dtype, geometry, speculation counters) as a dict."""
        return proto_to_dict(self._unary(self._stub.GetInfo, modeld_pb2.GetInfoRequest(), timeout))

    def capacity(self, *, timeout: float | None = None) -> dict:
        """modeld's Capacity as a dict: "memd" (memd's pools), "running_requests", "waiting_requests"."""
        return proto_to_dict(self._unary(self._stub.Capacity, modeld_pb2.CapacityRequest(), timeout))

    def health(self, service: str = "", *, timeout: float | None = None) -> str:
        """grpc.health.v1 status: SERVING, NOT_SERVING, ...; the status code name (e.g. UNAVAILABLE)
        when the check itself fails. A probe: one attempt, without waiting for the connection."""
        request = health_pb2.HealthCheckRequest(service=service)
        try:
            reply = self._health.Check(request, timeout=self._budget(timeout).remaining())
        except grpc.RpcError as exc:
            return exc.code().name
        return serving_status_name(reply)

    def close(self) -> None:
        """Close the channel; calls in flight are cancelled."""
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _budget(self, timeout: float | None) -> CallBudget:
        return CallBudget(self.timeout if timeout is None else timeout, self.max_retries)

    def _unary(self, method, request, timeout: float | None):
        budget = self._budget(timeout)
        while True:
            self._wait_until_connected(budget)
            try:
                return method(request, timeout=budget.remaining())
            except grpc.RpcError as exc:
                delay = budget.retry_delay(exc.code())
                if delay is None:
                    raise errors.from_rpc_error(exc) from exc
            self._connected = False
            time.sleep(delay)

    def _wait_until_connected(self, budget: CallBudget) -> None:
        if self._connected:
            return
        wait = min(self.connect_timeout, budget.remaining())
        try:
            self._health.Check(CONNECTION_PROBE, timeout=wait, wait_for_ready=True)
        except grpc.RpcError as exc:
            if not probe_reached_server(exc):
                raise errors.error_for("UNAVAILABLE", no_connection_message(self.address, wait)) from exc
        self._connected = True


def drain(chunks) -> None:
    for _ in chunks:
        pass


class StreamHandle(StreamState):
    """One Generate stream.

    Iterate it (once) for Chunk items; when the iteration ends, `result` holds the GenerateResult.
    `request_id` is modeld's id for the request once the first message has arrived. cancel(), leaving
    a `with` block early, or closing the iteration cancels the RPC, so modeld aborts the request; a
    stream cancelled by cancel() ends its iteration quietly and keeps `result` None.
    """

    def __iter__(self) -> Iterator[Chunk]:
        return self._chunks

    def __enter__(self) -> "StreamHandle":
        return self

    def __exit__(self, *exc_info) -> None:
        self.cancel()
        self._chunks.close()

    def _receive(self) -> Iterator[Chunk]:
        while not self._cancelled:
            self._client._wait_until_connected(self._budget)
            self._call = self._client._stub.Generate(self._request, timeout=self._budget.remaining())
            if self._cancelled:
                self._call.cancel()
            try:
                for response in self._call:
                    chunk = self._progress.take(response)
                    if chunk is not None:
                        yield chunk
                self._progress.finish()
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
            time.sleep(delay)
