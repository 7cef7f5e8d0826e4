"""memd's Calls stream: a client's allocation calls (Alloc, Free, MatchPrefix, MatchPrefixBatch) over one long-lived
bidirectional stream instead of one unary RPC each. Python gRPC spends about half of a unary round trip setting the
call up; a message on an open stream skips that (bench.memd.latency measures both).

Each call is answered by the same handler its unary RPC runs, so limits, session checks, errors and invariants are
the unary ones. What differs is only how a refusal travels: the handler's abort becomes a CallError answer for that
call, and the stream goes on. Calls are answered one at a time, in the order they came, each before the next is
read: as unary calls from one client are when it waits for each answer."""

import logging
import time
from collections.abc import AsyncIterator, Callable

import grpc

from memd.parse_guard import Unparsable
from protos import memd_pb2

log = logging.getLogger("memd")
METHODS = {"alloc": "Alloc", "free": "Free", "match_prefix": "MatchPrefix", "match_prefix_batch": "MatchPrefixBatch"}


class CallRefused(Exception):
    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self.code, self.details = code, details


class CallContext:
    """What a unary handler gets as its context for one call of the stream: its abort refuses that call alone."""

    def __init__(self, stream_context):
        self.stream_context = stream_context

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise CallRefused(code, details)

    def peer(self) -> str:
        return self.stream_context.peer()


def refusal(seq: int, code: grpc.StatusCode, message: str) -> memd_pb2.CallAnswer:
    return memd_pb2.CallAnswer(seq=seq, error=memd_pb2.CallError(code=code.value[0], message=message))


async def answer_calls(
    service,
    calls: AsyncIterator,
    context,
    observe: Callable[[str, float, grpc.StatusCode], None] | None = None,
    waiting: Callable[[bool], None] = lambda flag: None,
):
    """The answers to a Calls stream, in order; `observe(method, seconds, code)` times each call when metrics are on.
    `waiting(True)` just before the handler waits for the client's next call, `waiting(False)` when it has it (memd's
    shutdown cancels a stream only while it waits: that wait is the handler's own await)."""
    pending = calls.__aiter__()
    while True:
        waiting(True)
        try:
            call = await pending.__anext__()
        except StopAsyncIteration:
            return
        finally:
            waiting(False)
        if isinstance(call, Unparsable):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, call.reason)
        kind = call.WhichOneof("call")
        if kind is None:
            yield refusal(call.seq, grpc.StatusCode.INVALID_ARGUMENT, "the call names no operation")
            continue
        method, begin, code = METHODS[kind], time.perf_counter(), grpc.StatusCode.OK
        try:
            response = await getattr(service, method)(getattr(call, kind), CallContext(context))
            answer = memd_pb2.CallAnswer(seq=call.seq, **{kind: response})
        except CallRefused as refused:
            code, answer = refused.code, refusal(call.seq, refused.code, refused.details)
        except Exception as exc:  # a defect: the unary RPC would end with UNKNOWN; the stream goes on
            log.exception("memd failed a %s call", method)
            code, answer = grpc.StatusCode.UNKNOWN, refusal(call.seq, grpc.StatusCode.UNKNOWN, f"memd failed: {exc!r}")
        if observe is not None:
            observe(method, time.perf_counter() - begin, code)
        yield answer
