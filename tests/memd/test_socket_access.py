"""Who may call memd: grpcio gives a servicer no peer credentials, so the Unix socket's mode is the peer check
(memd.sockets). Without --allow-group the socket is 0600 (memd's user and root); with --allow-group G it is 0660 with
group G, in a folder that G can search (memd makes a new folder 0710 with group G, and refuses one G cannot search).
As root, the kernel's check itself is tried: a process of another uid cannot connect, one in group G can. TCP has
no peer check, and memd says so at start-up."""

import grp
import os
import pathlib
import pwd
import shutil
import socket
import stat
import subprocess
import sys
import tempfile

import pytest

from tests.daemons import REPO, child_env, memd_args, run_memd
from tests.models import tiny_target

EACCES = 13
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching to another uid needs root")


@pytest.fixture
def target(tmp_path):
    return tiny_target(tmp_path / "t")


@pytest.fixture
def folder():
    """A folder that others may pass through (not list): what is below it decides who reaches the socket."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="memd-access-", dir="/tmp"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def other_group() -> int:
    """A group memd's user may give its socket to, other than its primary group where there is one."""
    if os.geteuid() == 0:
        return next(g.gr_gid for g in grp.getgrall() if g.gr_gid not in (0, os.getgid(), nobody()[1]))
    return next((gid for gid in os.getgroups() if gid != os.getgid()), os.getgid())


def nobody() -> tuple[int, int]:
    try:
        entry = pwd.getpwnam("nobody")
        return entry.pw_uid, entry.pw_gid
    except KeyError:
        return 65534, 65534


def mode_and_group(path: pathlib.Path) -> tuple[int, int]:
    st = path.stat()
    return stat.S_IMODE(st.st_mode), st.st_gid


def connect_as(uid: int, gid: int, groups: list[int], path: pathlib.Path) -> int:
    """connect() to the socket at `path` from a child process with those ids: 0, or the errno it fails with."""
    pid = os.fork()
    if pid == 0:  # the child only switches ids and connects: no gRPC, no Python-level locks
        code = 0
        try:
            os.setgroups(groups)
            os.setgid(gid)
            os.setuid(uid)
            with socket.socket(socket.AF_UNIX) as probe:
                probe.connect(str(path))
        except OSError as exc:
            code = exc.errno or 255
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def memd_exit(target, *flags: str) -> tuple[int, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "memd", "--device", "cpu", "--target-model", str(target), *memd_args(), *flags],
        capture_output=True,
        text=True,
        env=child_env(),
        cwd=REPO,
        timeout=60,
    )
    return proc.returncode, proc.stderr.strip().splitlines()[-1]


def test_without_allow_group_the_socket_is_owner_only(target, folder):
    sock = folder / "memd.sock"
    with run_memd(target, *memd_args(), address=f"unix://{sock}"):
        assert mode_and_group(sock) == (0o600, os.getegid())


def test_allow_group_gives_the_socket_and_its_new_folder_to_the_group(target, folder):
    group = other_group()
    sock = folder / "new" / "memd.sock"  # memd makes the folder
    with run_memd(target, *memd_args(), "--allow-group", str(group), address=f"unix://{sock}") as memd:
        assert mode_and_group(sock) == (0o660, group)
        assert mode_and_group(sock.parent) == (0o710, group)
        assert f"group {group} allowed" in memd.log()


def test_allow_group_accepts_a_group_name(target, folder):
    group = other_group()
    sock = folder / "memd.sock"  # the folder is searchable by everyone, so by the group
    with run_memd(target, *memd_args(), "--allow-group", grp.getgrgid(group).gr_name, address=f"unix://{sock}"):
        assert mode_and_group(sock) == (0o660, group)


def test_allow_group_refuses_what_it_cannot_honour(target, folder):
    closed = folder / "closed"
    closed.mkdir(mode=0o700)
    code, message = memd_exit(target, "--listen", f"unix://{closed / 'memd.sock'}", "--allow-group", str(other_group()))
    assert code == 1 and "cannot reach a socket in" in message and not (closed / "memd.sock").exists()
    code, message = memd_exit(target, "--listen", "127.0.0.1:0", "--allow-group", str(other_group()))
    assert code == 1 and "--allow-group applies to a Unix socket" in message
    code, message = memd_exit(target, "--listen", f"unix://{folder / 'memd.sock'}", "--allow-group", "no-such-group")
    assert code == 1 and "--allow-group 'no-such-group': no such group" in message


def test_listening_on_tcp_warns_that_there_is_no_peer_check(target):
    with run_memd(target, *memd_args(), address="127.0.0.1:0", check_free=False) as memd:
        assert "memd listens on TCP: there is no peer check" in memd.log()


@as_root
def test_only_memds_user_and_the_allowed_group_can_connect(target, folder):
    uid, gid = nobody()
    group = other_group()
    owner_only, shared = folder / "memd.sock", folder / "shared" / "memd.sock"  # the first: its mode alone decides
    with (
        run_memd(target, *memd_args(), address=f"unix://{owner_only}"),
        run_memd(target, *memd_args(), "--allow-group", str(group), address=f"unix://{shared}"),
    ):
        assert connect_as(uid, gid, [], owner_only) == EACCES
        assert connect_as(uid, gid, [group], owner_only) == EACCES
        assert connect_as(uid, gid, [], shared) == EACCES
        assert connect_as(uid, gid, [group], shared) == 0
        assert connect_as(os.getuid(), os.getgid(), os.getgroups(), owner_only) == 0
