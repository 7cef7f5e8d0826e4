"""A bound on modeld's open Generate streams. Each open stream holds one thread of the gRPC server's pool while it
waits for its tokens; past the bound a new stream is refused at once with RESOURCE_EXHAUSTED, so the threads the
pool keeps beyond the bound always answer health, Abort, GetInfo and Capacity."""

import threading

import grpc

RESERVED_THREADS = 16  # the pool's threads that no stream may take


class StreamLimit(grpc.ServerInterceptor):
    def __init__(self, method: str, limit: int):
        self.method = method
        self.limit = limit
        self.open = 0  # streams of `method` running now; never above `limit`
        self.lock = threading.Lock()

    def pool_size(self) -> int:
        return self.limit + RESERVED_THREADS

    def intercept_service(self, continuation, details):
        handler = continuation(details)
        if handler is None or details.method != self.method or handler.unary_stream is None:
            return handler
        serve = handler.unary_stream

        def limited(request, context):
            with self.lock:
                admitted = self.open < self.limit
                self.open += admitted
            if not admitted:
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"too many open Generate streams (at most {self.limit}): retry later")
            try:
                yield from serve(request, context)
            finally:
                with self.lock:
                    self.open -= 1

        return grpc.unary_stream_rpc_method_handler(limited, request_deserializer=handler.request_deserializer,
                                                    response_serializer=handler.response_serializer)
