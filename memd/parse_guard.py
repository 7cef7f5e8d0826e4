"""A request that does not parse (a string that is not UTF-8, a corrupt message) is refused with INVALID_ARGUMENT and
the parser's reason, instead of gRPC's INTERNAL "Exception deserializing request!". The interceptors (ParseGuard for a
sync server, AsyncParseGuard for grpc.aio) parse each request themselves, so a handler of a single request only ever
sees one that parsed; a handler of a request stream sees an Unparsable in its place."""

import inspect

import grpc
from google.protobuf.message import DecodeError


class Unparsable:
    def __init__(self, reason: str):
        self.reason = reason


def tolerant(parse):
    """`parse`, returning an Unparsable in place of raising."""

    def parse_or_mark(data: bytes):
        try:
            return parse(data)
        except DecodeError as exc:
            return Unparsable(f"the request does not parse: {exc}")

    return parse_or_mark


def _guarded(handler, unary, streaming):
    """handler with a tolerant parser and a behaviour that refuses what did not parse. A stream of requests (memd's
    Calls) gets the tolerant parser alone: its handler meets an Unparsable among the requests and ends the stream."""
    if handler is None or handler.request_deserializer is None:
        return handler
    if handler.request_streaming:
        if not handler.response_streaming:
            return handler
        return grpc.stream_stream_rpc_method_handler(
            handler.stream_stream, tolerant(handler.request_deserializer), handler.response_serializer
        )
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(
            streaming(handler.unary_stream), tolerant(handler.request_deserializer), handler.response_serializer
        )
    return grpc.unary_unary_rpc_method_handler(
        unary(handler.unary_unary), tolerant(handler.request_deserializer), handler.response_serializer
    )


def _sync_unary(serve):
    def behaviour(request, context):
        if isinstance(request, Unparsable):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.reason)
        return serve(request, context)

    return behaviour


def _sync_streaming(serve):
    def behaviour(request, context):
        if isinstance(request, Unparsable):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.reason)
        yield from serve(request, context)

    return behaviour


def _async_unary(serve):
    async def behaviour(request, context):
        if isinstance(request, Unparsable):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.reason)
        return await serve(request, context)

    return behaviour


def _async_streaming(serve):
    if not inspect.isasyncgenfunction(serve):  # a coroutine that answers with context.write()
        return _async_unary(serve)

    async def behaviour(request, context):
        if isinstance(request, Unparsable):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.reason)
        responses = serve(request, context)
        try:
            async for response in responses:
                yield response
        finally:
            await responses.aclose()  # its clean-up (say, the end of memd's lease) runs when this stream ends

    return behaviour


class ParseGuard(grpc.ServerInterceptor):
    def intercept_service(self, continuation, details):
        return _guarded(continuation(details), _sync_unary, _sync_streaming)


class AsyncParseGuard(grpc.aio.ServerInterceptor):
    async def intercept_service(self, continuation, details):
        return _guarded(await continuation(details), _async_unary, _async_streaming)
