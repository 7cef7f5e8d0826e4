"""memd over gRPC: bad input gets the right status and changes nothing; health and
reflection; clean shutdown; stale segments of a crashed run are removed at start."""

import os
import pathlib
import signal
import stat
import subprocess
import sys

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from memd.attach import MemdSession
from protos import memd_pb2
from tests.daemons import memd_args, run_memd
from tests.models import tiny_draft, tiny_target


@pytest.fixture
def memd(tmp_path):
    target = tiny_target(tmp_path / "t")
    draft = tiny_draft(tmp_path / "d", window=32, block=4)
    with run_memd(
        target,
        *memd_args(draft=draft, ratio=0.5, window=32, budget=400_000, max_running=2, chunk=16),
        "--draft-eviction-interval",
        "0",
    ) as m:
        yield m


def snapshot(session: MemdSession, pools: dict):
    cap = session.stub.Capacity(memd_pb2.CapacityRequest(), timeout=5)
    return (
        cap.target.free,
        cap.draft.free,
        cap.running_requests,
        pools["target_to_draft"].clone(),
        pools["req_to_token"].clone(),
    )


def same(a, b) -> bool:
    return a[:3] == b[:3] and all((x == y).all() for x, y in zip(a[3:], b[3:]))


def expect(code, call):
    with pytest.raises(grpc.RpcError) as err:
        call()
    assert err.value.code() == code, err.value.details()
    return err.value.details()


def test_bad_input_gets_the_right_code_and_changes_nothing(memd):
    with MemdSession(memd.address, "bad-input") as s, MemdSession(memd.address, "other") as other:
        pools = s.map()
        held = s.alloc(extends=[("a", 0, 10)]).requests[0]
        other.alloc(extends=[("theirs", 0, 3)])
        before = snapshot(s, pools)
        stub = s.stub
        NF, IA, RE, FP = (
            grpc.StatusCode.NOT_FOUND,
            grpc.StatusCode.INVALID_ARGUMENT,
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            grpc.StatusCode.FAILED_PRECONDITION,
        )
        assert "unknown session" in expect(
            NF,
            lambda: stub.Alloc(
                memd_pb2.AllocRequest(session_id="nope", extends=[memd_pb2.ExtendOp(rid="x", num_tokens=1)]), timeout=5
            ),
        )
        expect(NF, lambda: stub.Free(memd_pb2.FreeRequest(session_id="nope", finish=["a"]), timeout=5))
        assert "not held" in expect(NF, lambda: s.free(finishes=["theirs"]))  # another session's request
        expect(NF, lambda: s.free(finishes=["never"]))
        expect(NF, lambda: s.alloc(grows=[("never", 1)]))
        assert "num_tokens" in expect(IA, lambda: s.alloc(extends=[("b", 0, -3)]))
        expect(IA, lambda: s.alloc(grows=[("a", 0)]))
        expect(IA, lambda: s.alloc(grows=[("a", -1)]))
        expect(IA, lambda: s.free(commits=[("a", 11)]))  # beyond its length
        expect(IA, lambda: s.free(commits=[("a", -1)]))
        expect(IA, lambda: s.alloc(extends=[("a", 3, 2)]))  # wrong prefix for a known request
        expect(FP, lambda: s.alloc(extends=[("new", 5, 2)]))  # new request with a prefix
        expect(IA, lambda: s.alloc(extends=[("c", 0, 2), ("c", 0, 2)]))
        expect(IA, lambda: s.alloc(extends=[("d", 0, 2)], finishes=["a"], grows=[("a", 1)]))
        assert "context" in expect(IA, lambda: s.alloc(extends=[("long", 0, 5000)]))
        # A valid release bundled with an allocation that cannot be met: nothing at all happens.
        expect(RE, lambda: s.alloc(commits=[("a", 5)], extends=[("big", 0, 600)]))
        expect(RE, lambda: s.alloc(extends=[("e", 0, 1), ("f", 0, 1)]))  # rows: max_running 2
        assert "out of range" in expect(
            IA, lambda: stub.Translate(memd_pb2.TranslateRequest(target_slots=[0]), timeout=5)
        )
        expect(IA, lambda: stub.Translate(memd_pb2.TranslateRequest(target_slots=[10**9]), timeout=5))
        expect(IA, lambda: stub.Translate(memd_pb2.TranslateRequest(target_slots=[-4]), timeout=5))
        assert same(before, snapshot(s, pools))
        # ... and the state is still usable.
        assert list(
            stub.Translate(memd_pb2.TranslateRequest(target_slots=held.target_slots), timeout=5).draft_slots
        ) == list(held.draft_slots)
        s.free(finishes=["a"])


def test_verify_release_and_out_of_window_free_over_grpc(memd):
    with MemdSession(memd.address, "steps") as s:
        pools = s.map()
        first = s.alloc(extends=[("r", 0, 40)]).requests[0]
        block = s.alloc(grows=[("r", 4)]).requests[0]
        assert block.start == 40 and len(block.target_slots) == 4
        # Verification kept 1 of the 4 drafted tokens: 3 slots go back on both sides.
        s.free(commits=[("r", 41)])
        cap = s.stub.Capacity(memd_pb2.CapacityRequest(), timeout=5)
        assert cap.target.used == 41 and cap.draft.used == 41
        assert pools["target_to_draft"][list(block.target_slots[1:])].eq(0).all()
        # Window 32: positions older than 41 - 32 = 9 lose their draft slots, target slots stay.
        freed = s.free(trims=["r"])
        assert (freed.target_freed, freed.draft_freed) == (0, 9)
        translated = s.stub.Translate(memd_pb2.TranslateRequest(target_slots=first.target_slots), timeout=5).draft_slots
        assert list(translated[:9]) == [0] * 9 and list(translated[9:]) == list(first.draft_slots[9:])
        assert pools["req_to_token"][first.row, :40].tolist() == list(first.target_slots)
        s.free(finishes=["r"])
        assert pools["req_to_token"][first.row].eq(0).all()


def test_health_and_reflection(memd):
    channel = grpc.insecure_channel(memd.address)
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "memd.v1.Memd"):
        reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    refl = reflection_pb2_grpc.ServerReflectionStub(channel)
    answers = refl.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5)
    names = {s.name for a in answers for s in a.list_services_response.service}
    assert {"memd.v1.Memd", "grpc.health.v1.Health"} <= names
    channel.close()


def test_socket_is_owner_only(memd):
    path = pathlib.Path(memd.address[len("unix://") :])
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    for entry in memd.shm_entries():
        assert stat.S_IMODE(os.stat(f"/dev/shm/{entry}").st_mode) == 0o600


def test_sigterm_tells_sessions_and_leaves_nothing(tmp_path):
    target = tiny_target(tmp_path / "t")
    with run_memd(target, *memd_args(), check_free=False) as memd:
        session = MemdSession(memd.address, "watcher")
        session.alloc(extends=[("x", 0, 7)])
        assert sorted(e.rsplit("-", 1)[1] for e in memd.shm_entries()) == ["req_to_token", "target_kv"]
        memd.proc.send_signal(signal.SIGTERM)
        assert session.lost.wait(10), "session was not told"
        assert "shutting down" in session.shutdown_reason
        assert memd.proc.wait(timeout=10) == 0
        assert memd.shm_entries() == []
        assert not pathlib.Path(memd.address[len("unix://") :]).exists()
        session.close()


def test_stale_segments_of_a_dead_memd_are_removed(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = pathlib.Path(f"/dev/shm/memd-{dead.pid}-00ff-target_kv")
    stale.write_bytes(b"x" * 64)
    target = tiny_target(tmp_path / "t")
    with run_memd(target, *memd_args()) as memd:
        assert not stale.exists()
        assert f"removed stale shared segment /dev/shm/{stale.name}" in memd.log()


def test_config_errors_exit_nonzero(tmp_path):
    target = tiny_target(tmp_path / "t")
    draft = tiny_draft(tmp_path / "d", window=64, block=4)
    cases = {
        "must be in (0, 1]": ["--draft-model", str(draft), "--draft-kv-ratio", "1.5"],
        "requires --draft-window": ["--draft-model", str(draft), "--draft-kv-ratio", "0.5"],
        "smaller than the draft block size": [
            "--draft-model",
            str(draft),
            "--draft-kv-ratio",
            "0.5",
            "--draft-window",
            "2",
        ],
        "Use at least": [
            "--draft-model",
            str(draft),
            "--draft-kv-ratio",
            "0.01",
            "--draft-window",
            "64",
            "--max-total-tokens",
            "4096",
        ],
    }
    for message, args in cases.items():
        proc = subprocess.run(
            [sys.executable, "-m", "memd", "--device", "cpu", "--target-model", str(target), *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode != 0 and message in proc.stderr, (message, proc.stderr)
