"""In-process stand-ins for modeld and memd that the client tests steer and inspect."""

import collections
import contextlib
import shutil
import tempfile
import threading
import time
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from protos import memd_pb2, memd_pb2_grpc, modeld_pb2, modeld_pb2_grpc

INVALID_TEMPERATURE = "temperature must be non-negative"


class FakeModeld(modeld_pb2_grpc.ModeldServicer):
    """Echoes the prompt back: a text prompt is one token per character (its code point); each
    token is sent as its own chunk, then the complete message. max_new_tokens cuts the echo
    (finish LENGTH); a negative temperature is INVALID_ARGUMENT, as modeld's validation says.

    Steering, set before the call:
      fail_with          (code, message): every call fails with it
      unavailable_first  the first k attempts of each method fail with UNAVAILABLE
      fail_after_chunks  (n, code): a stream sends n chunks, then fails with code
      pause_after_chunks n: a stream sends n chunks, then waits for the client to leave (0: hang)
      fail_request       (request_id, code): that request's stream alone fails with code after its first chunk
    Records: attempts (per method), requests (GenerateRequests), aborted (ids), stream_cut (set
    when a Generate stream ended before its complete message: cancelled, past its deadline, failed).
    """

    def __init__(self):
        self.fail_with = None
        self.unavailable_first = 0
        self.fail_after_chunks = None
        self.pause_after_chunks = None
        self.fail_request = None
        self.attempts = collections.Counter()
        self.requests: list[modeld_pb2.GenerateRequest] = []
        self.aborted: list[str] = []
        self.stream_cut = threading.Event()
        self.max_open_streams = 0  # what GetInfo reports (0: no bound reported)
        self.proceed = threading.Event()  # Generate streams wait for it before answering (clear it to hold them)
        self.proceed.set()
        self.open_streams = self.most_open_streams = 0
        self._count = threading.Lock()

    def Generate(self, request, context):
        self._begin("Generate", context)
        with self._count:
            self.open_streams += 1
            self.most_open_streams = max(self.most_open_streams, self.open_streams)
        try:
            self.proceed.wait(timeout=60)
            yield from self._generate(request, context)
        finally:
            with self._count:
                self.open_streams -= 1

    def _generate(self, request, context):
        self.requests.append(request)
        completed = threading.Event()
        context.add_callback(lambda: completed.is_set() or self.stream_cut.set())
        request_id = request.request_id or f"fake-{len(self.requests)}"
        sampling = request.sampling
        if sampling.HasField("temperature") and sampling.temperature < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, INVALID_TEMPERATURE)
        prompt = list(request.input_ids.ids) if request.HasField("input_ids") else [ord(c) for c in request.text]
        limit = sampling.max_new_tokens if sampling.HasField("max_new_tokens") else len(prompt)
        output = prompt[:limit]
        for sent, token in enumerate(output):
            if self.fail_after_chunks and sent == self.fail_after_chunks[0]:
                context.abort(self.fail_after_chunks[1], f"failed after {sent} chunks")
            if self.fail_request and sent == 1 and request.request_id == self.fail_request[0]:
                context.abort(self.fail_request[1], f"request {request.request_id} failed")
            if sent == self.pause_after_chunks:
                self._wait_for_client_to_leave(context)
                return
            chunk = modeld_pb2.GenerateChunk(token_ids=[token], text=chr(token))
            yield modeld_pb2.GenerateResponse(request_id=request_id, chunk=chunk)
        verify_ct = (len(output) + 1) // 2
        completed.set()
        yield modeld_pb2.GenerateResponse(
            request_id=request_id,
            complete=modeld_pb2.GenerateComplete(
                output_ids=output,
                text="".join(map(chr, output)),
                finish_reason=modeld_pb2.LENGTH if len(output) < len(prompt) else modeld_pb2.STOP,
                prompt_tokens=len(prompt),
                completion_tokens=len(output),
                cached_tokens=1,
                spec_verify_ct=verify_ct,
                spec_accept_length=len(output) / verify_ct if verify_ct else 0.0,
            ),
        )

    def Abort(self, request, context):
        self._begin("Abort", context)
        self.aborted.append(request.request_id)
        known = {r.request_id or f"fake-{i + 1}" for i, r in enumerate(self.requests)}
        return modeld_pb2.AbortResponse(found=request.request_id in known)

    def GetInfo(self, request, context):
        self._begin("GetInfo", context)
        return modeld_pb2.GetInfoResponse(
            target_model="fake-target", page_size=1, target_tokens=1 << 40, max_open_streams=self.max_open_streams
        )

    def Capacity(self, request, context):
        self._begin("Capacity", context)
        return modeld_pb2.CapacityResponse(memd=fake_memd_capacity(), running_requests=2, waiting_requests=1)

    def _begin(self, method: str, context) -> None:
        self.attempts[method] += 1
        if self.fail_with:
            context.abort(*self.fail_with)
        if self.attempts[method] <= self.unavailable_first:
            context.abort(grpc.StatusCode.UNAVAILABLE, "warming up")

    def _wait_for_client_to_leave(self, context, limit_s: float = 30.0) -> None:
        give_up = time.monotonic() + limit_s
        while context.is_active() and time.monotonic() < give_up:
            time.sleep(0.01)


class FakeMemd(memd_pb2_grpc.MemdServicer):
    """Answers Capacity, and FlushCache: the first flush frees 64 target / 16 draft tokens, later ones 0."""

    def __init__(self):
        self.flushed = False

    def Capacity(self, request, context):
        return fake_memd_capacity()

    def FlushCache(self, request, context):
        freed = (0, 0) if self.flushed else (64, 16)
        self.flushed = True
        return memd_pb2.FlushCacheResponse(target_freed=freed[0], draft_freed=freed[1])


def fake_memd_capacity() -> memd_pb2.CapacityResponse:
    target = memd_pb2.PoolCapacity(
        total=1000, free=900, used=100, held_by_requests=70, evictable=20, protected=10, bytes=1 << 33
    )
    holding = memd_pb2.SessionHolding(
        label="session 1", client_name="modeld", model_digest="0123456789abcdef", target_held=70
    )
    return memd_pb2.CapacityResponse(
        target=target,
        page_size=1,
        request_cap=1000,
        max_running_requests=8,
        running_requests=2,
        sessions=1,
        session_holdings=[holding],
    )


@contextlib.contextmanager
def serve(servicer, add_to_server):
    """Serve `servicer` and SERVING grpc.health.v1 on a Unix socket in a fresh /tmp folder; yield its address."""
    folder = tempfile.mkdtemp(prefix="cl-", dir="/tmp")
    address = f"unix://{folder}/s.sock"
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    add_to_server(servicer, server)
    health_servicer = health.HealthServicer()
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    server.add_insecure_port(address)
    server.start()
    try:
        yield address
    finally:
        server.stop(grace=None)
        shutil.rmtree(folder, ignore_errors=True)
