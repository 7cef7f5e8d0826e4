"""modeld on a memd whose segment was removed under it (as a memd in another pid namespace once did): start-up fails
with a message naming the segment, a re-attach is refused and health is never turned SERVING, and no file is
created in the segment's place."""

import logging
import threading
import time

import pytest

import modeld.front.server
from memd.segments import SHM_DIR
from tests.daemons import link_to_a_stopped_memd, memd_args, run_memd
from tests.models import tiny_target

MEMD_ARGS = [
    "--page-size",
    "1",
    "--max-running-requests",
    "4",
    "--max-total-tokens",
    "4096",
    "--draft-model",
    "none",
    "--kv-cache-dtype",
    "float32",
    "--strict",
]


def remove_segment(memd, buffer: str):
    """Unlink one of a live memd's segments, as another memd's sweep did; return its path."""
    path = next(SHM_DIR / name for name in memd.shm_entries() if name.endswith(f"-{buffer}"))
    path.unlink()
    return path


def test_modeld_refuses_to_start_on_a_missing_segment(default_model):
    with run_memd(default_model, *MEMD_ARGS) as memd:
        gone = remove_segment(memd, "req_to_token")
        argv = [
            "--device",
            "cpu",
            "--listen",
            "127.0.0.1:0",
            "--memd",
            memd.address,
            "--connect-timeout",
            "10",
            "--target-model",
            str(default_model),
        ]
        with pytest.raises(SystemExit) as exited:
            modeld.front.server.main(argv)
        assert (
            exited.value.code == f"modeld: error: cannot map memd's pools: memd's shared segment {gone} is "
            "missing (removed while memd runs?)"
        )
        assert not gone.exists()
        deadline = time.monotonic() + 5
        while memd.capacity().sessions:  # the session it opened is closed (its end reaches memd asynchronously)
            assert time.monotonic() < deadline, "modeld's session was left open"
            time.sleep(0.05)


def test_a_reattach_to_a_memd_with_a_missing_segment_never_turns_serving(tmp_path, caplog):
    target = tiny_target(tmp_path / "t")
    health: list[bool] = []
    link, address = link_to_a_stopped_memd(target, health)
    with run_memd(target, *memd_args(), address=address) as second:
        gone = remove_segment(second, "target_kv")
        stopped, attached = threading.Event(), []
        with caplog.at_level(logging.ERROR, logger="modeld"):
            thread = threading.Thread(target=lambda: attached.append(link.reattach(stopped)))
            thread.start()
            deadline = time.monotonic() + 20
            while not any(str(gone) in record.getMessage() for record in caplog.records):
                assert time.monotonic() < deadline, "the failed map was never reported"
                time.sleep(0.05)
            stopped.set()
            thread.join(timeout=10)
        assert attached == [False] and health == []
        assert not gone.exists()
        link.close()
