"""memd's gRPC servicer. Every handler runs on the one asyncio loop, so allocator state is
mutated by one thread only; no handler awaits between reading and writing that state.

Calls of a session carry its secret (memd.sessions); the handlers resolve it to the session's public
label, which is all the allocator, the logs and Capacity ever see."""

import asyncio
import hashlib
import logging
import os

import grpc
import numpy as np

from memd.buffers import SharedBuffers
from memd.call_stream import answer_calls
from memd.errors import InvariantViolation, MemdError
from memd.invariants import check_structure
from memd.limits import CallLimits, check_attach
from memd.log_text import loggable
from memd.sessions import Session, SessionTable
from memd.slots import Release, SlotManager
from protos import memd_pb2, memd_pb2_grpc

log = logging.getLogger("memd")


class MemdService(memd_pb2_grpc.MemdServicer):
    def __init__(self, mgr: SlotManager, buffers: SharedBuffers, layout: memd_pb2.Layout, strict: bool, on_fatal):
        self.mgr = mgr
        self.buffers = buffers
        self.layout = layout
        self.strict = strict
        self.on_fatal = on_fatal  # called with a message when an invariant breaks
        self.shutting_down = asyncio.Event()
        self.shutdown_reason = ""
        self.sessions = SessionTable()
        self.digest_key = os.urandom(16)  # Capacity's model digests: keyed afresh each run (model_digest)
        self.limits = CallLimits(max_ops=mgr.max_requests, max_slots=mgr.max_requests * mgr.context_len)
        self.observe = None  # with metrics on: observe(method, seconds, code) for each call of a Calls stream
        # the tasks serving open Calls streams -> whether each waits for its client's next call (memd.call_stream)
        self.call_streams: dict[asyncio.Task, bool] = {}

    # ---- sessions -------------------------------------------------------------------
    async def Attach(self, request, context):
        if self.shutting_down.is_set():
            await context.abort(grpc.StatusCode.UNAVAILABLE, "memd is shutting down")
        await self._check(context, check_attach, request)
        secret, session = self.open_session(
            request.client_name or context.peer(), request.model_fingerprint, request.writes_draft_kv
        )
        model = (
            f"of model {self.model_digest(session.model)}"
            if session.model
            else "without a model identity (no prefix cache)"
        )
        log.info("%s %s attached (%s)", session.label, model, loggable(session.client_name))
        try:
            yield memd_pb2.SessionEvent(
                attached=memd_pb2.Attached(session_id=secret, layout=self.layout, label=session.label)
            )
            await self.shutting_down.wait()
            yield memd_pb2.SessionEvent(shutting_down=memd_pb2.ShuttingDown(reason=self.shutdown_reason))
        finally:
            self._end_session(secret, session)

    def open_session(self, client_name: str, model: str, writes_draft: bool) -> tuple[str, Session]:
        """A new session in the table and the allocator: (its secret, the session)."""
        secret, session = self.sessions.open(client_name, model)
        self.mgr.open_session(session.label, model=model, writes_draft=writes_draft)
        return secret, session

    def _end_session(self, secret: str, session: Session) -> None:
        """The lease is over (stream closed, peer gone, or shutdown): free what it held."""
        held = self.mgr.held_tokens(session.label)
        self.mgr.close_session(session.label)
        self.sessions.close(secret)
        try:
            self._after_mutation()
        except InvariantViolation as exc:
            self._fatal(exc)
        log.info("%s ended; freed %d target / %d draft tokens", session.label, *held)

    async def notify_shutdown(self, reason: str, timeout: float = 1.0) -> None:
        """Refuse new calls and end every open Calls stream with UNAVAILABLE, waiting up to `timeout` for them to
        end: the server's grace would otherwise end them with its own status. A stream's task is cancelled only while
        it waits for its client's next call, so the cancel lands in its handler, which aborts; a cancel that landed
        while gRPC writes an answer would end the handler without a status."""
        self.shutdown_reason = reason
        self.shutting_down.set()
        deadline = asyncio.get_running_loop().time() + timeout
        while self.call_streams and asyncio.get_running_loop().time() < deadline:
            for task, waiting in list(self.call_streams.items()):
                if waiting:
                    task.cancel()
            await asyncio.sleep(0.01)

    # ---- allocation -----------------------------------------------------------------
    async def Alloc(self, request, context):
        await self._check(context, self.limits.check_alloc, request)
        release = release_from_message(request.release)
        extends = [(op.rid, op.prefix_len, op.num_tokens) for op in request.extends]
        grows = [(op.rid, op.num_tokens) for op in request.grows]
        label = await self._label(context, request.session_id)
        allocated = await self._run(context, self.mgr.step, label, release, extends, grows)
        return memd_pb2.AllocResponse(requests=[request_slots(a) for a in allocated])

    async def Free(self, request, context):
        await self._check(context, self.limits.check_release, request)
        label = await self._label(context, request.session_id)
        freed = await self._run(context, self.mgr.apply_release, label, release_from_message(request))
        return memd_pb2.FreeResponse(target_freed=freed[0], draft_freed=freed[1])

    async def MatchPrefix(self, request, context):
        await self._check(context, self.limits.check_match, request)
        label = await self._label(context, request.session_id)
        matched = await self._run(
            context, self.mgr.match_prefix, label, request.rid, list(request.token_ids), request.extend_to
        )
        return match_response(matched)

    async def MatchPrefixBatch(self, request, context):
        await self._check(context, self.limits.check_match_batch, request)
        label = await self._label(context, request.session_id)
        matched = await self._run(
            context,
            self.mgr.match_prefix_batch,
            label,
            [(item.rid, list(item.token_ids), item.extend_to) for item in request.items],
        )
        return memd_pb2.MatchPrefixBatchResponse(matches=[match_response(m) for m in matched])

    async def Calls(self, request_iterator, context):
        """Alloc, Free, MatchPrefix and MatchPrefixBatch calls over one stream (memd.call_stream). A shutdown ends
        every open stream with UNAVAILABLE at once (the server's grace would otherwise wait for them)."""
        if self.shutting_down.is_set():
            await context.abort(grpc.StatusCode.UNAVAILABLE, "memd is shutting down")
        task = asyncio.current_task()
        self.call_streams[task] = False

        def waiting(flag: bool) -> None:
            if task in self.call_streams:
                self.call_streams[task] = flag

        try:
            async for answer in answer_calls(self, request_iterator, context, self.observe, waiting):
                yield answer
        except asyncio.CancelledError:
            if not self.shutting_down.is_set():
                raise
            self.call_streams.pop(task, None)  # ending: notify_shutdown cancels it no more (its abort runs whole)
            await context.abort(grpc.StatusCode.UNAVAILABLE, "memd is shutting down")
        finally:
            self.call_streams.pop(task, None)

    async def FlushCache(self, request, context):
        freed = await self._run(context, self.mgr.flush_cache)
        return memd_pb2.FlushCacheResponse(target_freed=freed[0], draft_freed=freed[1])

    async def _check(self, context, check, value) -> None:
        """A bound of memd.limits: a call past one is refused before any work."""
        try:
            check(value)
        except MemdError as exc:
            await context.abort(getattr(grpc.StatusCode, exc.code), str(exc))

    async def _label(self, context, secret: str) -> str:
        """The label of the session whose secret the call carries; NOT_FOUND for any other id."""
        try:
            return self.sessions.resolve(secret).label
        except MemdError as exc:
            await context.abort(getattr(grpc.StatusCode, exc.code), str(exc))

    async def _run(self, context, op, *args):
        try:
            result = op(*args)
            self._after_mutation()
            return result
        except InvariantViolation as exc:
            self._fatal(exc)
            await context.abort(grpc.StatusCode.INTERNAL, f"memd invariant violated: {exc}")
        except MemdError as exc:
            await context.abort(getattr(grpc.StatusCode, exc.code), str(exc))

    def _after_mutation(self) -> None:
        """Publish table writes before answering; in strict mode, check every invariant and
        stop memd loudly (naming the side and the numbers) when one breaks."""
        self.buffers.sync()
        if self.strict:
            check_structure(self.mgr)

    def _fatal(self, exc: InvariantViolation) -> None:
        log.critical("memd invariant violated: %s", exc)
        self.on_fatal(str(exc))

    # ---- queries --------------------------------------------------------------------
    async def Translate(self, request, context):
        try:
            self.limits.check_translate(request)
            draft = self.mgr.translate(np.asarray(request.target_slots, np.int64))
        except MemdError as exc:
            await context.abort(getattr(grpc.StatusCode, exc.code), str(exc))
        return memd_pb2.TranslateResponse(draft_slots=draft.tolist())

    def model_digest(self, fingerprint: str) -> str:
        """What Capacity shows of a session's model: a keyed digest of its fingerprint, so that an attached client
        can tell which sessions share a model, but cannot learn the fingerprint that joins its prefix cache (the
        key is random each run: a digest is no fingerprint at the next run either)."""
        if not fingerprint:
            return ""
        return hashlib.blake2b(fingerprint.encode(), key=self.digest_key, digest_size=8).hexdigest()

    async def Capacity(self, request, context):
        mgr, layout = self.mgr, self.layout
        ranks = max(1, layout.tensor_parallel_size)
        target_evictable, target_protected, draft_evictable, draft_protected = mgr.cache_counts()
        target = _pool(
            mgr.target.total_tokens, mgr.target.free_tokens, target_evictable, target_protected, layout.target, ranks
        )
        draft = memd_pb2.PoolCapacity()
        if layout.has_draft:
            total = mgr.draft.total_tokens if mgr.draft else mgr.target.total_tokens
            free = mgr.draft.free_tokens if mgr.draft else mgr.target.free_tokens
            draft = _pool(total, free, draft_evictable, draft_protected, layout.draft, ranks)
        holdings = []
        for session in self.sessions:  # by label: the secrets stay with their clients
            held_target, held_draft = mgr.held_tokens(session.label)
            held_draft = held_draft if layout.has_draft else 0
            target.held_by_requests += held_target
            draft.held_by_requests += held_draft
            holdings.append(
                memd_pb2.SessionHolding(
                    label=session.label,
                    client_name=session.client_name,
                    model_digest=self.model_digest(session.model),
                    target_held=held_target,
                    draft_held=held_draft,
                )
            )
        return memd_pb2.CapacityResponse(
            target=target,
            draft=draft,
            has_draft=layout.has_draft,
            draft_kv_ratio=layout.draft_kv_ratio,
            draft_window=layout.draft_window,
            page_size=layout.page_size,
            request_cap=layout.request_cap,
            max_running_requests=layout.max_running_requests,
            running_requests=sum(1 for _ in mgr.requests()),
            sessions=len(mgr.sessions),
            context_len=layout.context_len,
            epoch=layout.epoch,
            session_holdings=holdings,
            tensor_parallel_size=ranks,
        )


def _pool(
    total: int, free: int, evictable: int, protected: int, geometry: memd_pb2.PoolGeometry, ranks: int
) -> memd_pb2.PoolCapacity:
    """One side's pool, its slots counted once (they are the same on every rank) and its bytes over every rank's
    buffer; `used` counts the prefix cache too (free + evictable + protected + held == total)."""
    return memd_pb2.PoolCapacity(
        total=total,
        free=free,
        used=total - free,
        evictable=evictable,
        protected=protected,
        bytes=geometry.bytes * ranks,
        bytes_per_rank=geometry.bytes,
    )


def release_from_message(request: memd_pb2.FreeRequest) -> Release:
    return Release(
        commits=tuple((op.rid, op.length) for op in request.commits),
        trims=tuple((op.rid, op.length) if op.HasField("length") else op.rid for op in request.trims),
        finishes=tuple(request.finish),
        inserts=tuple((op.rid, tuple(op.token_ids)) for op in request.cache),
    )


def request_slots(a) -> memd_pb2.RequestSlots:
    """An allocation (memd.slots.Allocated) as the API's RequestSlots."""
    return memd_pb2.RequestSlots(
        rid=a.rid, row=a.row, start=a.start, target_slots=a.target_slots.tolist(), draft_slots=a.draft_slots.tolist()
    )


def match_response(m) -> memd_pb2.MatchPrefixResponse:
    """A match (memd.slots.Matched) as the API's MatchPrefixResponse, with its extension when it has one."""
    return memd_pb2.MatchPrefixResponse(
        rid=m.rid,
        row=m.row,
        cached_len=m.cached_len,
        target_slots=m.target_slots.tolist(),
        draft_slots=m.draft_slots.tolist(),
        extension=None if m.extension is None else request_slots(m.extension),
    )
