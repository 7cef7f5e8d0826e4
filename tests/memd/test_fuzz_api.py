"""memd's gRPC API under random operations (hypothesis), strict mode on: random sessions, requests, sizes and
releases, good and bad. memd never crashes (strict mode would exit on any broken invariant), answers every call
either with success or with a client error code (never INTERNAL or UNKNOWN), and once the sessions end and the
prefix cache is flushed its pools are fully free."""

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memd.attach import MemdSession
from protos import memd_pb2
from tests.daemons import is_idle, memd_args, run_memd
from tests.models import tiny_draft, tiny_target

CLIENT_ERRORS = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.FAILED_PRECONDITION,
}
RIDS = ["a", "b", "c", "d", ""]
sizes = st.one_of(st.integers(-3, 40), st.sampled_from([0, 1, 2**31 - 1, -(2**31)]))
tokens = st.lists(st.integers(-2, 60), max_size=48)
rid = st.sampled_from(RIDS)

op = st.one_of(
    st.tuples(st.just("extend"), rid, st.integers(-2, 40), sizes),
    st.tuples(st.just("grow"), rid, sizes),
    st.tuples(st.just("commit"), rid, sizes),
    st.tuples(st.just("trim"), rid),
    st.tuples(st.just("finish"), rid, st.booleans(), tokens),
    st.tuples(st.just("checkpoint"), rid, tokens),
    st.tuples(st.just("match"), rid, tokens),
    st.tuples(st.just("match-batch"), st.lists(st.tuples(rid, tokens, sizes), max_size=3)),
    st.tuples(st.just("translate"), st.lists(st.integers(-5, 5000), max_size=8)),
    st.tuples(st.just("flush")),
)


@pytest.fixture(scope="module")
def memd(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fuzz")
    target = tiny_target(folder / "t")
    draft = tiny_draft(folder / "d", window=32, block=4)
    with run_memd(
        target,
        *memd_args(draft=draft, ratio=0.5, window=32, budget=400_000, max_running=2, chunk=16),
        "--draft-eviction-interval",
        "0",
        "--page-size",
        "4",
    ) as m:
        yield m


def call(session: MemdSession, step) -> None:
    kind, *args = step
    if kind == "extend":
        session.alloc(extends=[(args[0], args[1], args[2])])
    elif kind == "grow":
        session.alloc(grows=[(args[0], args[1])])
    elif kind == "commit":
        session.free(commits=[(args[0], args[1])])
    elif kind == "trim":
        session.free(trims=[args[0]])
    elif kind == "finish":
        session.free(finishes=[args[0]], cache=[(args[0], args[2])] if args[1] else [])
    elif kind == "checkpoint":
        session.free(cache=[(args[0], args[1])])
    elif kind == "match":
        session.match_prefix(args[0], args[1])
    elif kind == "match-batch":
        session.match_prefix_batch(args[0])
    elif kind == "translate":
        session.stub.Translate(memd_pb2.TranslateRequest(target_slots=args[0]), timeout=5)
    else:
        session.flush_cache()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sessions=st.lists(st.lists(op, max_size=12), min_size=1, max_size=2))
def test_random_operations_never_crash_or_leak(memd, sessions):
    opened = [MemdSession(memd.address, f"fuzz-{i}", model_fingerprint="fuzz") for i in range(len(sessions))]
    try:
        for step in range(max(map(len, sessions))):
            for session, steps in zip(opened, sessions):
                if step < len(steps):
                    try:
                        call(session, steps[step])
                    except grpc.RpcError as exc:
                        assert exc.code() in CLIENT_ERRORS, f"{steps[step]}: {exc.code().name} {exc.details()}"
                    assert memd.proc.poll() is None, memd.log()
    finally:
        for session in opened:
            session.close()
    cap = memd.wait_idle(timeout=5)
    assert is_idle(cap), cap
    memd.flush_and_wait_free()
    cap = memd.capacity()
    assert cap.target.free == cap.target.total and cap.draft.free == cap.draft.total, cap
