"""memd as a daemon, a second process writing K/V through the shared pools, a third
reading exactly those bytes back; and the lease: kill -9 frees a session's slots."""

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.daemons import REPO, child_env, memd_args, run_memd
from tests.models import tiny_draft, tiny_target

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
SCRIPTS = REPO / "tests" / "scripts"


def script(name: str, *args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(SCRIPTS / name), *args],
        env=child_env(str(SCRIPTS)),
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **kw,
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("page", [1, 64])
def test_second_process_writes_third_reads_back(tmp_path, device, page):
    target = tiny_target(tmp_path / "t", layers=3, dtype="bfloat16")
    draft = tiny_draft(tmp_path / "d", layers=2, head_dim=32, window=128, block=4)
    args = memd_args(draft=draft, ratio=0.5, window=128, page=page, budget=8_000_000)
    with run_memd(target, *args, device=device) as memd:
        writer = script("kv_writer.py", memd.address, str(tmp_path / "slots.json"))
        assert writer.stdout.readline().strip() == "ready", writer.stderr.read()
        cap = memd.capacity()
        assert cap.target.used == cap.draft.used == (2 * 64 if page == 64 else 42)
        reader = script("kv_reader.py", memd.address, str(tmp_path / "slots.json"))
        out, err = reader.communicate(timeout=120)
        assert reader.returncode == 0, err
        assert out.startswith("ok: "), out
        print(out)
        writer.stdin.write("quit\n")
        writer.stdin.flush()
        assert writer.wait(timeout=30) == 0


@pytest.mark.parametrize("device", DEVICES)
def test_kill_9_frees_the_session_within_2s(tmp_path, device):
    target = tiny_target(tmp_path / "t")
    draft = tiny_draft(tmp_path / "d")
    with run_memd(target, *memd_args(draft=draft, ratio=0.5, window=64), device=device) as memd:
        holder = script("kv_writer.py", memd.address, str(tmp_path / "slots.json"))
        assert holder.stdout.readline().strip() == "ready", holder.stderr.read()
        assert memd.capacity().target.used == 42
        os.kill(holder.pid, signal.SIGKILL)
        killed = time.monotonic()
        holder.wait()
        cap = memd.wait_all_free(timeout=2.0)
        elapsed = time.monotonic() - killed
        assert cap.target.free == cap.target.total and cap.draft.free == cap.draft.total, cap
        assert cap.sessions == 0
        assert elapsed < 2.0, f"slots freed after {elapsed:.2f} s"
