"""Sessions are capabilities (memd.sessions), over gRPC: the session id is a secret that only its own Attach stream
carries; Capacity and memd's log show labels and client names, never a secret; a call with another session's label,
or any id that is not an open session's secret, is refused with NOT_FOUND (the same answer either way, so labels are
no oracle), without repeating the id, and changes nothing."""

import re
import secrets

import grpc
import pytest

from memd.attach import MemdSession
from protos import memd_pb2
from tests.daemons import memd_args, run_memd
from tests.models import tiny_target

NOT_FOUND = grpc.StatusCode.NOT_FOUND


@pytest.fixture
def memd(tmp_path):
    with run_memd(tiny_target(tmp_path / "t"), *memd_args(budget=400_000, max_running=4, chunk=16)) as m:
        yield m


def capacity(session: MemdSession) -> memd_pb2.CapacityResponse:
    return session.stub.Capacity(memd_pb2.CapacityRequest(), timeout=5)


def test_capacity_shows_labels_and_client_names_and_never_a_secret(memd):
    with MemdSession(memd.address, "alpha") as a, MemdSession(memd.address, "beta", model_fingerprint="f00d" * 8) as b:
        a.alloc(extends=[("r1", 0, 10)])
        b.alloc(extends=[("r2", 0, 3)])
        cap = capacity(a)
        holdings = {h.label: (h.client_name, h.model_digest, h.target_held) for h in cap.session_holdings}
        digest = holdings[b.label][1]
        assert holdings == {a.label: ("alpha", "", 10), b.label: ("beta", digest, 3)}
        assert re.fullmatch(r"[0-9a-f]{16}", digest) and digest not in "f00d" * 8  # the fingerprint is never shown
        assert re.fullmatch(r"session \d+", a.label) and a.label != b.label
        assert cap.target.held_by_requests == 13 and cap.sessions == 2
        for secret in (a.session_id, b.session_id):
            assert re.fullmatch(r"[0-9a-f]{32}", secret), "128 random bits, as hex"
            assert secret.encode() not in cap.SerializeToString() and secret not in str(cap)
            assert secret[:8] not in memd.log(), "memd's log names sessions by label only"
        assert a.session_id != b.session_id
        a.free(finishes=["r1"])
        b.free(finishes=["r2"])
    assert f"{a.label} of model" not in memd.log() and f"{b.label} of model {digest} attached ('beta')" in memd.log()
    assert "f00d" * 8 not in memd.log()  # the log shows the digest, as Capacity does


def test_a_call_with_another_sessions_label_or_a_made_up_id_is_refused(memd):
    with MemdSession(memd.address, "victim") as victim, MemdSession(memd.address, "intruder") as intruder:
        victim.alloc(extends=[("running", 0, 8)])
        before = capacity(victim)
        stub = intruder.stub
        for claimed in (victim.label, intruder.label, secrets.token_hex(16), victim.session_id[:-1], ""):
            calls = {
                "Alloc": lambda: stub.Alloc(
                    memd_pb2.AllocRequest(session_id=claimed, extends=[memd_pb2.ExtendOp(rid="mine", num_tokens=4)]),
                    timeout=5,
                ),
                "Free": lambda: stub.Free(memd_pb2.FreeRequest(session_id=claimed, finish=["running"]), timeout=5),
                "MatchPrefix": lambda: stub.MatchPrefix(
                    memd_pb2.MatchPrefixRequest(session_id=claimed, rid="mine", token_ids=[1, 2, 3]), timeout=5
                ),
                "MatchPrefixBatch": lambda: stub.MatchPrefixBatch(
                    memd_pb2.MatchPrefixBatchRequest(
                        session_id=claimed, items=[memd_pb2.MatchItem(rid="mine", token_ids=[1, 2, 3])]
                    ),
                    timeout=5,
                ),
            }
            for name, call in calls.items():
                with pytest.raises(grpc.RpcError) as refused:
                    call()
                assert refused.value.code() == NOT_FOUND, (name, claimed, refused.value.details())
                assert "unknown session" in refused.value.details()
                assert not claimed or claimed not in refused.value.details(), "the id is not repeated"
        assert capacity(victim) == before, "a refused call changes nothing"
        victim.free(finishes=["running"])  # still the victim's own


def test_a_session_closes_as_fast_as_its_release(memd):
    """close() ends the lease and the channel without waiting out a connectivity poll (channel_ready_future's watch
    made every close take 200 ms); memd has freed what the session held when it returns to a new session's view."""
    import time

    took = []
    for _ in range(3):
        session = MemdSession(memd.address, "short")
        session.alloc(extends=[("r", 0, 5)])
        start = time.monotonic()
        session.close()
        took.append(time.monotonic() - start)
    assert min(took) < 0.15, took  # each was at least 0.198 s with the poll
    with MemdSession(memd.address, "after") as after:
        deadline = time.monotonic() + 5
        while capacity(after).target.held_by_requests and time.monotonic() < deadline:
            time.sleep(0.01)
        assert capacity(after).target.held_by_requests == 0
