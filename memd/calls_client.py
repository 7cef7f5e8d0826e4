"""The client end of memd's Calls stream (memd.call_stream): a session's Alloc, Free, MatchPrefix and
MatchPrefixBatch calls sent over one long-lived stream, each answered by a future.

The stream opens with the first call and again with the first call after it ended. When it ends (memd gone, the
connection lost, or a call past its deadline, which cancels it), every call still unanswered fails with the
stream's status, as the same unary calls would. A call memd refuses raises CallFailed, a grpc.RpcError with the
code and details its unary RPC would have ended with."""

import collections
import concurrent.futures
import queue
import threading
import time

import grpc

from protos import memd_pb2

STATUS_BY_NUMBER = {status.value[0]: status for status in grpc.StatusCode}


class CallFailed(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(f"{code.name}: {details}")
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class Answer:
    """One call's answer: done() without waiting; result() waits until the call's deadline, then cancels the stream
    (memd may or may not have applied the call, as with a unary call past its deadline)."""

    def __init__(self, future: concurrent.futures.Future, kind: str, deadline: float, stream: "OpenStream"):
        self.future, self.kind, self.deadline, self.stream = future, kind, deadline, stream

    def done(self) -> bool:
        return self.future.done()

    def result(self):
        try:
            answer = self.future.result(timeout=max(self.deadline - time.monotonic(), 0.0))
        except concurrent.futures.TimeoutError:
            self.stream.end(CallFailed(grpc.StatusCode.DEADLINE_EXCEEDED, "memd did not answer before the deadline"))
            answer = self.future.result()  # ended above, if the answer did not come meanwhile
        if answer.WhichOneof("answer") == "error":
            raise CallFailed(STATUS_BY_NUMBER.get(answer.error.code, grpc.StatusCode.UNKNOWN), answer.error.message)
        return getattr(answer, self.kind)


class OpenStream:
    """One Calls stream: its outgoing queue, the calls it has not answered (in the order sent) and a thread that
    reads the answers."""

    def __init__(self, method):
        self.requests: queue.Queue = queue.Queue()
        self.pending: collections.deque = collections.deque()  # (seq, future), oldest first
        self.lock = threading.Lock()
        self.ended: CallFailed | None = None
        self.call = method(iter(self.requests.get, None))
        self.reader = threading.Thread(target=self._read, daemon=True, name="memd-calls")
        self.reader.start()

    def send(self, call: memd_pb2.Call) -> concurrent.futures.Future:
        future = concurrent.futures.Future()
        with self.lock:
            if self.ended is not None:
                future.set_exception(self.ended)
                return future
            self.pending.append((call.seq, future))
            self.requests.put(call)
        return future

    def _read(self) -> None:
        failure = CallFailed(grpc.StatusCode.UNAVAILABLE, "memd ended the call stream")
        try:
            for answer in self.call:
                with self.lock:
                    seq, future = self.pending.popleft() if self.pending else (None, None)
                if seq != answer.seq:  # memd answers in order: anything else is a defect, fatal to the stream
                    failure = CallFailed(grpc.StatusCode.INTERNAL, f"memd answered call {answer.seq}, expected {seq}")
                    if future is not None:
                        future.set_exception(failure)
                    break
                future.set_result(answer)
        except grpc.RpcError as exc:
            failure = CallFailed(exc.code(), exc.details() or "memd's call stream failed")
        self.end(failure)

    def end(self, failure: CallFailed) -> None:
        """Fails every unanswered call with `failure` and stops the stream (from any thread; once)."""
        with self.lock:
            if self.ended is None:
                self.ended = failure
                self.requests.put(None)
            pending, self.pending = list(self.pending), collections.deque()
        self.call.cancel()
        for _, future in pending:
            if not future.done():
                future.set_exception(self.ended)

    def close(self) -> None:
        self.end(CallFailed(grpc.StatusCode.CANCELLED, "the session closed"))
        self.reader.join(timeout=5)


class CallStream:
    """A session's calls over memd's Calls stream (`method`: a MemdStub's Calls); thread-safe (calls are sent, and
    answered, in the order submit() was called)."""

    def __init__(self, method):
        self.method = method
        self.lock = threading.Lock()
        self.stream: OpenStream | None = None
        self.seq = 0

    def submit(self, kind: str, request, timeout: float) -> Answer:
        """Sends one call (`kind`: alloc, free, match_prefix or match_prefix_batch) without waiting for memd."""
        with self.lock:
            if self.stream is None or self.stream.ended is not None:
                self.stream = OpenStream(self.method)
            self.seq += 1
            stream = self.stream
            future = stream.send(memd_pb2.Call(seq=self.seq, **{kind: request}))
        return Answer(future, kind, time.monotonic() + timeout, stream)

    def close(self) -> None:
        with self.lock:
            stream, self.stream = self.stream, None
        if stream is not None:
            stream.close()
