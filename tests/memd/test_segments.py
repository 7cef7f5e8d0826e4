"""memd's shared segments (memd.segments): the start-up sweep removes a segment only when no live process holds its
lock and it is this uid's, whatever pid its name carries (a memd in another pid namespace sees other pids); memd
unlinks only the files it created; a client never creates a segment, and a missing or short one is a clear error."""

import fcntl
import os
import pathlib
import secrets
import signal
import subprocess
import sys

import pytest

from memd import segments
from memd.attach import MemdSession
from memd.mapping import map_buffer
from memd.segments import SHM_DIR, Segment, SegmentError, remove_stale_segments
from protos import memd_pb2
from tests.daemons import memd_args, run_memd
from tests.models import tiny_target

HOLD_LOCK = (
    "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); fcntl.flock(fd, fcntl.LOCK_EX); "
    "print('locked', flush=True); sys.stdin.read()"
)


def unseen_pid() -> int:
    """A pid no process here has, as a live memd's pid looks from another pid namespace."""
    return int(pathlib.Path("/proc/sys/kernel/pid_max").read_text()) + 1


def segment_name(buffer: str = "target_kv") -> str:
    return f"memd-{unseen_pid()}-{secrets.token_hex(8)}-{buffer}"


def hold_lock(path: pathlib.Path) -> subprocess.Popen:
    """Another process holding `path`'s lock, as a live memd holds its segments'."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "locked"
    return proc


def kill_9(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def test_a_held_segment_survives_the_sweep_whatever_pid_its_name_carries(tmp_path):
    live = tmp_path / segment_name()
    live.write_bytes(b"kv" * 32)
    holder = hold_lock(live)
    try:
        assert remove_stale_segments(tmp_path) == []
        assert live.read_bytes() == b"kv" * 32
    finally:
        kill_9(holder)


def test_a_segment_whose_holder_was_killed_is_removed(tmp_path):
    stale = tmp_path / segment_name()
    stale.write_bytes(b"kv")
    kill_9(hold_lock(stale))  # the kernel drops the lock with the process
    assert remove_stale_segments(tmp_path) == [stale.name]
    assert not stale.exists()


@pytest.mark.skipif(
    os.geteuid() != 0,
    reason="giving a file to another uid needs root (and only root could "
    "remove another user's file from a sticky /dev/shm anyway)",
)
def test_another_users_file_is_never_removed_even_by_root(tmp_path):
    foreign = tmp_path / segment_name()
    foreign.write_bytes(b"kv")
    os.chown(foreign, 65534, 65534)  # nobody's; no process holds its lock
    assert remove_stale_segments(tmp_path) == []
    assert foreign.exists()


def test_the_sweep_leaves_what_is_not_a_segment_file(tmp_path):
    kept = tmp_path / "kept"
    kept.write_bytes(b"x")
    (tmp_path / segment_name()).symlink_to(kept)
    (tmp_path / segment_name()).mkdir()
    (tmp_path / "memd-notasegment").write_bytes(b"x")
    before = sorted(tmp_path.iterdir())
    assert remove_stale_segments(tmp_path) == []
    assert sorted(tmp_path.iterdir()) == before and kept.read_bytes() == b"x"


def test_a_created_segment_is_locked_full_size_and_removed_by_its_creator(tmp_path):
    segment = Segment.create(tmp_path / segment_name(), 4096)
    assert segment.path.stat().st_size == 4096 and segment.path.stat().st_mode & 0o777 == 0o600
    assert remove_stale_segments(tmp_path) == []  # its lock is held: another memd's sweep keeps it
    segment.remove()
    assert not segment.path.exists()


def test_memd_never_unlinks_a_file_it_did_not_create(tmp_path):
    segment = Segment.create(tmp_path / segment_name(), 64)
    segment.path.unlink()
    segment.path.write_bytes(b"someone else's")  # the name now holds a file memd did not create
    segment.remove()
    assert segment.path.read_bytes() == b"someone else's"


def test_a_creation_that_loses_its_new_file_to_a_sweep_creates_it_again(tmp_path, monkeypatch):
    path, taken = tmp_path / segment_name(), []
    real_flock = fcntl.flock

    def swept_before_locked(fd, operation):
        if not taken:
            path.unlink()  # a sweep opened the new file, took its lock first and unlinked it
        taken.append(fd)
        real_flock(fd, operation)

    monkeypatch.setattr(segments.fcntl, "flock", swept_before_locked)
    segment = Segment.create(path, 64)
    monkeypatch.undo()
    assert len(taken) == 2 and path.stat().st_size == 64
    assert remove_stale_segments(tmp_path) == []  # the file that has the name is the locked one
    segment.remove()


def shm_desc(name: str, size: int) -> memd_pb2.BufferDesc:
    return memd_pb2.BufferDesc(
        name="target_kv", backend="shm", dtype="float32", shape=[size // 4], strides=[1], size_bytes=size, shm_name=name
    )


def test_mapping_a_missing_segment_is_an_error_naming_it_and_creates_nothing():
    name = segment_name()
    with pytest.raises(SegmentError, match=f"/dev/shm/{name} is missing"):
        map_buffer(shm_desc(name, 64))
    assert not (SHM_DIR / name).exists()


def test_mapping_a_short_segment_is_an_error_naming_it_and_leaves_it_as_it_is():
    segment = Segment.create(SHM_DIR / segment_name(), 32)
    try:
        with pytest.raises(SegmentError, match=f"/dev/shm/{segment.path.name} holds 32 bytes, its layout says 64"):
            map_buffer(shm_desc(segment.path.name, 64))
        assert segment.path.stat().st_size == 32
    finally:
        segment.remove()


def test_a_client_maps_only_memd_segment_names():
    with pytest.raises(SegmentError, match="is not a memd segment name"):
        map_buffer(shm_desc("../../etc/hostname", 4))


def test_a_mapped_segment_is_shared_memory():
    segment = Segment.create(SHM_DIR / segment_name(), 64)
    try:
        first, second = map_buffer(shm_desc(segment.path.name, 64)), map_buffer(shm_desc(segment.path.name, 64))
        first[3] = 7.5
        assert second[3].item() == 7.5
    finally:
        segment.remove()


def test_a_second_memd_removes_only_segments_no_live_process_holds(tmp_path):
    target = tiny_target(tmp_path / "t")
    with run_memd(target, *memd_args()) as live:
        own = next(SHM_DIR / name for name in live.shm_entries() if name.endswith("-target_kv"))
        hidden = own.with_name(f"memd-{unseen_pid()}-{own.name.split('-', 2)[2]}")  # its pid as seen elsewhere
        own.rename(hidden)  # the same file, still locked by the live memd
        try:
            with run_memd(target, *memd_args(), check_free=False) as killed:
                kill_9(killed.proc)
                left = killed.shm_entries()
            assert sorted(name.rsplit("-", 1)[1] for name in left) == ["req_to_token", "target_kv"]
            with run_memd(target, *memd_args()) as second:
                log = second.log()
            assert hidden.exists() and hidden.name not in log
            for name in left:
                assert f"removed stale shared segment /dev/shm/{name}" in log and not (SHM_DIR / name).exists()
        finally:
            hidden.rename(own)
        with MemdSession(live.address, "reader") as session:
            assert set(session.map()) == {"target_kv", "req_to_token"}
    assert live.shm_entries() == []  # its own segments went with it
