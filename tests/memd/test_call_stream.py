"""memd's Calls stream (memd.call_stream; the client end memd.calls_client), what MemdSession sends its Alloc, Free
and matches over: each call answers as its unary RPC does, a refused call fails alone with the unary call's status
and the stream goes on, a stream that ends fails what it had not answered and the next call opens another, and the
stream's calls are counted in memd's metrics under their own method."""

import re
import signal
import threading
import urllib.request

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from memd.attach import MemdSession
from memd.calls_client import CallFailed, CallStream
from protos import memd_pb2
from tests.daemons import memd_args, run_memd
from tests.models import tiny_target

IDS = list(range(100, 140))


@pytest.fixture
def memd(tmp_path):
    with run_memd(
        tiny_target(tmp_path / "t"), *memd_args(budget=400_000, max_running=4, chunk=16), "--metrics-port", "0"
    ) as m:
        yield m


def raw_calls(session: MemdSession):
    """The Calls method with bytes in: what a client that sends anything at all can send."""
    return session.channel.stream_stream(
        "/memd.v1.Memd/Calls",
        request_serializer=lambda data: data,
        response_deserializer=memd_pb2.CallAnswer.FromString,
    )


def test_calls_over_the_stream_answer_as_memd_holds_them(memd):
    with MemdSession(memd.address, "stream") as s:
        pools = s.map()
        matched = s.match_prefix("a", IDS, extend_to=len(IDS))
        grant = matched.extension
        assert (matched.cached_len, grant.start, len(grant.target_slots)) == (0, 0, len(IDS))
        assert pools["req_to_token"][grant.row, : len(IDS)].tolist() == list(grant.target_slots)
        grown = s.alloc(grows=[("a", 3)]).requests[0]
        assert grown.start == len(IDS) and len(grown.target_slots) == 3
        assert pools["req_to_token"][grant.row, len(IDS) : len(IDS) + 3].tolist() == list(grown.target_slots)
        batch = s.match_prefix_batch([("b", IDS[:20], 20), ("c", IDS[:5])])
        assert [m.rid for m in batch] == ["b", "c"] and len(batch[0].extension.target_slots) == 20
        assert memd.capacity().target.held_by_requests == len(IDS) + 3 + 20
        assert s.free(finishes=["a", "b", "c"]).target_freed > 0
        assert s.calls.seq == 4 and s.calls.stream.ended is None, "four calls, one stream"


def test_a_refused_call_fails_alone_with_its_unary_status_and_the_stream_goes_on(memd):
    with MemdSession(memd.address, "refused") as s:
        s.alloc(extends=[("held", 0, 8)])
        stream = s.calls.stream
        before = memd.capacity()
        bad = {  # each is refused before anything changes
            "alloc": memd_pb2.AllocRequest(
                session_id=s.session_id, grows=[memd_pb2.GrowOp(rid="unknown", num_tokens=1)]
            ),
            "free": memd_pb2.FreeRequest(session_id="not-a-session", finish=["held"]),
            "match_prefix": memd_pb2.MatchPrefixRequest(session_id=s.session_id, rid="held", token_ids=[1, 2]),
            "match_prefix_batch": memd_pb2.MatchPrefixBatchRequest(
                session_id=s.session_id, items=[memd_pb2.MatchItem(rid="x", token_ids=[-1])]
            ),
        }
        unary = {
            "alloc": s.stub.Alloc,
            "free": s.stub.Free,
            "match_prefix": s.stub.MatchPrefix,
            "match_prefix_batch": s.stub.MatchPrefixBatch,
        }
        for kind, request in bad.items():
            with pytest.raises(grpc.RpcError) as by_rpc:
                unary[kind](request, timeout=5)
            with pytest.raises(CallFailed) as by_stream:
                s.calls.submit(kind, request, timeout=5).result()
            assert (by_stream.value.code(), by_stream.value.details()) == (by_rpc.value.code(), by_rpc.value.details())
            assert by_stream.value.code() != grpc.StatusCode.OK
        after = memd.capacity()
        assert (after.target.free, after.running_requests) == (before.target.free, before.running_requests)
        assert s.calls.stream is stream and stream.ended is None
        s.free(finishes=["held"])  # the same stream still serves
        assert s.calls.stream is stream


def test_a_call_naming_no_operation_is_refused_and_an_unparsable_one_ends_the_stream(memd):
    with MemdSession(memd.address, "raw") as s:
        answers = raw_calls(s)(iter([memd_pb2.Call(seq=7).SerializeToString()]))
        answer = next(answers)
        assert answer.seq == 7 and answer.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert "names no operation" in answer.error.message
        with pytest.raises(grpc.RpcError) as err:
            list(raw_calls(s)(iter([b"\xff\xff\xff"])))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "does not parse" in err.value.details()
        s.alloc(extends=[("after", 0, 4)])  # memd serves on
        s.free(finishes=["after"])


def test_memd_gone_fails_the_call_with_unavailable(tmp_path):
    with run_memd(
        tiny_target(tmp_path / "t"), *memd_args(budget=400_000, max_running=4, chunk=16), check_free=False
    ) as m:
        with MemdSession(m.address, "orphan") as s:
            s.alloc(extends=[("r", 0, 4)])
            m.proc.send_signal(signal.SIGKILL)
            m.proc.wait(timeout=10)
            with pytest.raises(grpc.RpcError) as err:
                s.alloc(grows=[("r", 1)])
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE


class SilentCall:
    """A Calls stream that answers nothing until cancelled (a memd that hangs)."""

    def __init__(self):
        self.cancelled = threading.Event()

    def __iter__(self):
        self.cancelled.wait(10)
        raise CallFailed(grpc.StatusCode.CANCELLED, "cancelled")

    def cancel(self):
        self.cancelled.set()


def test_a_call_past_its_deadline_ends_its_stream_and_the_next_call_opens_another():
    opened = []

    def method(requests):
        opened.append(SilentCall())
        return opened[-1]

    calls = CallStream(method)
    first, second = (calls.submit("free", memd_pb2.FreeRequest(), timeout=0.2) for _ in range(2))
    with pytest.raises(CallFailed) as err:
        first.result()
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED and opened[0].cancelled.is_set()
    assert second.done() and second.future.exception().code() == grpc.StatusCode.DEADLINE_EXCEEDED
    calls.submit("free", memd_pb2.FreeRequest(), timeout=5)
    assert len(opened) == 2 and not opened[1].cancelled.is_set()
    calls.close()
    assert opened[1].cancelled.is_set()


def test_the_streams_calls_are_counted_under_their_own_method(memd):
    def samples():
        url = re.search(r"metrics on (http://\S+/metrics)", memd.log()).group(1)
        with urllib.request.urlopen(url, timeout=10) as reply:
            text = reply.read().decode()
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    allocs = ("memd:rpc_duration_seconds_count", (("method", "Alloc"),))
    refused = ("memd:rpc_errors_total", (("code", "NOT_FOUND"), ("method", "Free")))
    before = samples()
    with MemdSession(memd.address, "counted") as s:
        s.alloc(extends=[("r", 0, 4)])
        s.alloc(grows=[("r", 2)])
        with pytest.raises(CallFailed):
            s.free(finishes=["not-held"])
        s.free(finishes=["r"])
    after = samples()
    assert after[allocs] - before.get(allocs, 0) == 2
    assert after[refused] - before.get(refused, 0) == 1


def test_a_shutdown_ends_an_open_stream_with_unavailable_at_once(tmp_path):
    with run_memd(
        tiny_target(tmp_path / "t"), *memd_args(budget=400_000, max_running=4, chunk=16), check_free=False
    ) as m:
        with MemdSession(m.address, "open") as s:
            s.alloc(extends=[("r", 0, 4)])
            stream = s.calls.stream
            m.proc.send_signal(signal.SIGTERM)
            stream.reader.join(timeout=10)
            assert stream.ended.code() == grpc.StatusCode.UNAVAILABLE
            assert stream.ended.details() == "memd is shutting down", "ended by memd, not by the server's grace"
            assert m.proc.wait(timeout=10) == 0
