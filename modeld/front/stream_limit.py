"""A bound on modeld's open Generate streams. Every stream lives on the server's one asyncio loop and holds its
request's queue and text state while it waits for tokens; past the bound a new stream is refused at once with
RESOURCE_EXHAUSTED (never queued behind the others), and health, Abort, GetInfo and Capacity answer whatever is
open."""

import grpc


class StreamLimit(grpc.aio.ServerInterceptor):
    def __init__(self, method: str, limit: int):
        self.method = method
        self.limit = limit
        self.open = 0  # streams of `method` running now; never above `limit` (only the loop's thread counts)

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None or details.method != self.method or handler.unary_stream is None:
            return handler
        serve = handler.unary_stream

        async def limited(request, context):
            if self.open >= self.limit:
                await context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"too many open Generate streams (at most {self.limit}): retry later",
                )
            self.open += 1
            responses = serve(request, context)
            try:
                async for response in responses:
                    yield response
            finally:
                self.open -= 1
                await responses.aclose()  # the stream's own clean-up (the abort of a request left behind) runs now

        return grpc.unary_stream_rpc_method_handler(
            limited, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
        )
