"""memd's shared-memory segments: files under /dev/shm named `memd-<pid>-<epoch>-<buffer>`, mode 0600.

Who creates, who holds, who removes (the invariant every function here keeps):
- Only memd creates a segment (`Segment.create`): O_CREAT | O_EXCL, then an exclusive flock on its file, then
  its full size, all before its name goes out in a layout. The pid in the name is for people reading /dev/shm;
  nothing trusts it (a memd in another pid namespace sees other pids, or none).
- From then until memd unlinks it, memd holds that flock. The kernel drops it when the process ends, however it
  ends (kill -9 included) and in whatever pid namespace, so "the lock can be taken" means "no live memd owns it".
- A segment is removed only by the memd that created it, at exit (`Segment.remove`: and only while the name still
  holds the file it created), or by a later memd's start-up sweep (`remove_stale_segments`): only a regular file
  of the sweeping memd's own uid (never another user's, even as root) whose lock it takes without waiting.
- A client never creates, extends or truncates a segment: `open_segment` opens an existing one without O_CREAT,
  and a missing one, or one smaller than the layout says, is a `SegmentError` naming it.
"""

import fcntl
import mmap
import os
import pathlib
import re
import stat

SHM_DIR = pathlib.Path("/dev/shm")
SEGMENT_NAME = re.compile(r"^memd-\d+-[0-9a-f]+-[a-z_]+(_rank\d+)?$")


class SegmentError(RuntimeError):
    """A segment a layout names cannot be mapped: missing, too small, or not a memd segment name."""


def _names_this_file(path: pathlib.Path, fd: int) -> bool:
    """Whether `path` still refers to the file open as `fd` (not unlinked, not replaced)."""
    try:
        named = os.lstat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


class Segment:
    """A segment this memd created; its lock is held until `remove`."""

    def __init__(self, path: pathlib.Path, fd: int):
        self.path, self.fd = path, fd

    @classmethod
    def create(cls, path: pathlib.Path, size: int) -> "Segment":
        """Create `path` locked and committed to `size` bytes (at least 1)."""
        while True:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            # Another memd's sweep may open the file before this lock is taken; it then holds the lock, unlinks the
            # file and lets go. Once the lock is ours, a file still named is ours for good; an unlinked one is retried.
            fcntl.flock(fd, fcntl.LOCK_EX)
            if _names_this_file(path, fd):
                break
            os.close(fd)
        segment = cls(path, fd)
        try:
            os.posix_fallocate(fd, 0, max(size, 1))  # commit the memory now, not at first touch
        except OSError as exc:
            segment.remove()
            raise MemoryError(f"/dev/shm cannot hold {size} bytes for {path.name}: {exc}") from None
        return segment

    def remove(self) -> None:
        """Unlink the name if it still holds the file created here (never a file put there since), then drop the
        lock: a named segment of a live memd is always locked."""
        if _names_this_file(self.path, self.fd):
            self.path.unlink()
        os.close(self.fd)


def remove_stale_segments(shm_dir: pathlib.Path = SHM_DIR) -> list[str]:
    """Unlink the segments of this uid that no live process holds; return their names."""
    entries = sorted(shm_dir.iterdir()) if shm_dir.exists() else []
    return [entry.name for entry in entries if SEGMENT_NAME.match(entry.name) and _remove_if_stale(entry)]


def _remove_if_stale(path: pathlib.Path) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False  # gone meanwhile, a symlink, or not ours to open
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            return False  # never another user's file, even as root
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # a live memd holds it, in whatever pid namespace
        if not _names_this_file(path, fd):
            return False
        path.unlink()  # still holding the lock: a memd creating this name right now sees it unlinked and retries
        return True
    finally:
        os.close(fd)


def open_segment(name: str, size: int) -> mmap.mmap:
    """A shared, writable mapping of `size` bytes of memd's segment `name`. Never creates or resizes it."""
    if not SEGMENT_NAME.match(name):
        raise SegmentError(f"{name!r} is not a memd segment name")
    path = SHM_DIR / name
    try:
        fd = os.open(path, os.O_RDWR)  # no O_CREAT: a missing segment must stay missing
    except FileNotFoundError:
        raise SegmentError(f"memd's shared segment {path} is missing (removed while memd runs?)") from None
    try:
        actual = os.fstat(fd).st_size
        if actual < size:
            raise SegmentError(f"memd's shared segment {path} holds {actual} bytes, its layout says {size}")
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)
