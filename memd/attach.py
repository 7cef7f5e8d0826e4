"""Client side of memd: open a session (a lease), make its calls, and map memd's buffers into torch tensors.

    with MemdSession("unix:///run/memd.sock", "modeld") as session:
        pools = session.map()            # name -> torch.Tensor, no copy
        k0 = pools["target_kv"][0, 0]    # layer 0 K rows: [rows, kv_heads, head_dim]

The session lives as long as the Attach stream: close it (or exit, or crash) and memd
frees everything the session held.
"""

import threading

import grpc

from memd.calls_client import CallStream
from memd.sockets import CHANNEL_OPTIONS
from protos import memd_pb2, memd_pb2_grpc


class MemdSession:
    """An attached session: `stub`, `session_id` (the session's secret: keep it to this client), `label` (its
    public name), `layout`, and `map()` for the buffers.

    writes_draft_kv=False is for a client that never writes draft KV (no speculation): the prefixes
    it puts into memd's cache keep no draft KV, so no speculating client reads draft KV never written.
    model_fingerprint names the model whose KV the client writes: the session matches and caches only
    that model's prefixes. Without one ("") it gets no prefix cache.
    """

    def __init__(
        self,
        address: str,
        client_name: str = "",
        connect_timeout: float = 10.0,
        writes_draft_kv: bool = True,
        model_fingerprint: str = "",
    ):
        self.channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        self.stub = memd_pb2_grpc.MemdStub(self.channel)
        # Wait for memd with a first unary call rather than grpc.channel_ready_future: the future's connectivity
        # watch stays on the channel and made every close() wait out its 200 ms poll.
        try:
            self.stub.Capacity(memd_pb2.CapacityRequest(), wait_for_ready=True, timeout=connect_timeout)
        except grpc.RpcError as exc:
            self.channel.close()
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise grpc.FutureTimeoutError(
                    f"memd at {address} did not answer within {connect_timeout:g} s"
                ) from None
            raise
        self.calls = CallStream(self.stub.Calls)  # Alloc, Free and the matches: over one stream, not a unary RPC each
        attach = memd_pb2.AttachRequest(
            client_name=client_name, writes_draft_kv=writes_draft_kv, model_fingerprint=model_fingerprint
        )
        self._events = self.stub.Attach(attach)
        try:
            first = next(self._events)
        except grpc.RpcError:
            self.channel.close()  # memd refused the session (shutting down, say): nothing of the attempt stays open
            raise
        self.session_id = first.attached.session_id
        self.label = first.attached.label
        self.layout = first.attached.layout
        self.lost = threading.Event()  # set when memd ends the session (shutdown or connection loss)
        self.shutdown_reason = ""
        self._watcher = threading.Thread(target=self._watch, daemon=True, name="memd-lease")
        self._watcher.start()

    def _watch(self) -> None:
        try:
            for event in self._events:
                if event.HasField("shutting_down"):
                    self.shutdown_reason = event.shutting_down.reason
        except grpc.RpcError:
            pass
        self.lost.set()

    def map(self, rank: int = 0) -> dict:
        """This session's layout mapped for tensor-parallel rank `rank` (map_layout)."""
        return map_layout(self.layout, rank)

    def match_prefix(
        self, rid: str, token_ids, extend_to: int = 0, timeout: float = 10.0
    ) -> memd_pb2.MatchPrefixResponse:
        """Start request `rid` from the longest cached prefix of `token_ids`: it holds positions
        [0, cached_len) and a row; continue it with an extend at prefix_len cached_len. With `extend_to`, the answer's
        `extension` (when there was room) grants [cached_len, extend_to) too."""
        request = memd_pb2.MatchPrefixRequest(
            session_id=self.session_id, rid=rid, token_ids=list(token_ids), extend_to=extend_to
        )
        return self.calls.submit("match_prefix", request, timeout).result()

    def match_prefix_batch(self, items, timeout: float = 10.0) -> list[memd_pb2.MatchPrefixResponse]:
        """match_prefix for each (rid, token_ids[, extend_to]) in one round trip (a burst of arrivals), in order: the
        answers of the leading items; an item memd had no request row for, and those after it, are not in it
        (unmatched). Extensions are granted in order until the first memd has no room for (none after it)."""
        request = memd_pb2.MatchPrefixBatchRequest(
            session_id=self.session_id,
            items=[
                memd_pb2.MatchItem(rid=rid, token_ids=list(ids), extend_to=extend_to[0] if extend_to else 0)
                for rid, ids, *extend_to in items
            ],
        )
        return list(self.calls.submit("match_prefix_batch", request, timeout).result().matches)

    def alloc(self, extends=(), grows=(), commits=(), trims=(), finishes=(), cache=(), timeout: float = 10.0):
        """One scheduler step: the releases (commits [(rid, length)], trims [rid or (rid, length)], finishes [rid],
        cache
        [(rid, token_ids)] of finished requests), then extends [(rid, prefix_len, n)] and grows [(rid, n)]."""
        request = memd_pb2.AllocRequest(
            session_id=self.session_id,
            release=self._release(commits, trims, finishes, cache),
            extends=[memd_pb2.ExtendOp(rid=r, prefix_len=p, num_tokens=n) for r, p, n in extends],
            grows=[memd_pb2.GrowOp(rid=r, num_tokens=n) for r, n in grows],
        )
        return self.calls.submit("alloc", request, timeout).result()

    def alloc_async(self, grows=(), trims=(), finishes=(), cache=(), timeout: float = 10.0):
        """Grows [(rid, n)] with releases (trims, finishes, cache as in alloc), sent without waiting: an answer whose
        done() says whether memd answered and whose result() is the AllocResponse (or raises its grpc.RpcError)."""
        request = memd_pb2.AllocRequest(
            session_id=self.session_id,
            release=self._release((), trims, finishes, cache),
            grows=[memd_pb2.GrowOp(rid=r, num_tokens=n) for r, n in grows],
        )
        return self.calls.submit("alloc", request, timeout)

    def free(self, commits=(), trims=(), finishes=(), cache=(), timeout: float = 10.0):
        """Releases alone; `cache` [(rid, token_ids)]: finished requests whose first len(token_ids)
        positions go into the prefix cache (each rid also in `finishes`)."""
        return self.calls.submit("free", self._release(commits, trims, finishes, cache), timeout).result()

    def flush_cache(self, timeout: float = 10.0) -> memd_pb2.FlushCacheResponse:
        """Drop every cached prefix (FAILED_PRECONDITION while any session holds a request)."""
        return self.stub.FlushCache(memd_pb2.FlushCacheRequest(), timeout=timeout)

    def _release(self, commits, trims, finishes, cache=()) -> memd_pb2.FreeRequest:
        return memd_pb2.FreeRequest(
            session_id=self.session_id,
            commits=[memd_pb2.CommitOp(rid=r, length=n) for r, n in commits],
            trims=[
                memd_pb2.TrimOp(rid=t) if isinstance(t, str) else memd_pb2.TrimOp(rid=t[0], length=t[1]) for t in trims
            ],
            finish=list(finishes),
            cache=[memd_pb2.CacheOp(rid=r, token_ids=list(ids)) for r, ids in cache],
        )

    def close(self) -> None:
        """End the lease; memd frees what this session held."""
        self._events.cancel()
        self.calls.close()
        self._watcher.join(timeout=5)  # no thread may still be inside the stream when the channel goes
        self.channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def map_layout(layout: memd_pb2.Layout, rank: int = 0) -> dict:
    """name -> torch.Tensor for each of memd's buffers that tensor-parallel rank `rank` uses (its own KV buffers and
    the shared tables; memd.mapping: torch is imported by clients that map), and on the GPU "tables_written" ->
    memd's event, which a stream waits on before it reads a table a reply told of. A layout is all a process needs to
    map them: modeld's other ranks map what rank 0's session was given."""
    from memd.mapping import map_buffer, open_tables_written

    ranks = max(1, layout.tensor_parallel_size)
    if not 0 <= rank < ranks:
        raise ValueError(f"rank {rank} is not one of memd's {ranks} tensor-parallel ranks")
    pools = {desc.name: map_buffer(desc) for desc in layout.buffers if desc.shared or desc.rank == rank}
    event = open_tables_written(layout)
    if event is not None:
        pools["tables_written"] = event
    return pools
