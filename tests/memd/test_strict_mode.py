"""Strict mode: a broken leak invariant is reported with the side and the numbers, the call fails
with INTERNAL, and memd is told to stop (on_fatal)."""

import asyncio

import grpc
import numpy as np
import pytest

from memd.errors import InvariantViolation
from memd.invariants import check_leak
from memd.service import MemdService
from memd.slots import DraftMode, Release, SlotManager
from protos import memd_pb2


def manager() -> SlotManager:
    P, pages = 4, 16
    return SlotManager(
        target_pages=pages,
        draft_pages=8,
        page_size=P,
        mode=DraftMode.BOUNDED,
        window=8,
        trim_gap=0,
        max_requests=2,
        context_len=64,
        mapping=np.zeros((pages + 1) * P, np.int32),
        req_to_token=np.zeros((3, 64), np.int32),
    )


def test_leak_message_names_side_and_numbers():
    mgr = manager()
    mgr.open_session("s", model="m")
    mgr.step("s", Release(), extends=[("a", 0, 10)])
    mgr.draft._free.pop()  # a draft page vanishes
    with pytest.raises(
        InvariantViolation, match=r"draft side: free 16 \+ evictable 0 \+ protected 0 \+ held 12 = 28 != total 32"
    ):
        check_leak(mgr)


class _Buffers:
    def sync(self):
        pass


class _Context:
    code = None

    async def abort(self, code, details):
        self.code, self.details = code, details
        raise grpc.RpcError(details)


def test_strict_service_fails_the_call_and_stops_memd():
    mgr = manager()
    fatal = []
    service = MemdService(mgr, _Buffers(), memd_pb2.Layout(), strict=True, on_fatal=fatal.append)
    secret, _ = service.open_session("strict-test", model="m", writes_draft=True)
    mgr.target._free.pop()  # a target page vanishes: the next mutating call must notice
    context = _Context()
    request = memd_pb2.AllocRequest(session_id=secret, extends=[memd_pb2.ExtendOp(rid="a", num_tokens=3)])
    with pytest.raises(grpc.RpcError):
        asyncio.run(service.Alloc(request, context))
    assert context.code == grpc.StatusCode.INTERNAL and "target side" in context.details
    assert fatal and "target side: free 56" in fatal[0]
