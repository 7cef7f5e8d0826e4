"""modeld runs its engine in a process of its own, under the gRPC front. Either one dying never leaves the other
serving nothing: an engine that dies fails every open stream with UNAVAILABLE and turns health NOT_SERVING (its
memd session ends with it, so memd frees what it held), then the front starts a new engine, which serves again; an
engine that keeps dying makes the front exit 1 (modeld.front.engine_supervisor); a front that dies takes its engine with
it."""

import os
import pathlib
import signal
import time

import pytest

import client
from modeld.front.engine_supervisor import MAX_RESTARTS
from tests.daemons import is_idle, memd_args, run_memd, run_modeld
from tests.gateway.test_metrics_scrape import scrape, settled, total

MEMD_ARGS = memd_args(max_running=4, budget=40_000_000, chunk=64)


def engine_pid(front_pid: int) -> int:
    """The engine process: the front's one child that is a Python interpreter (multiprocessing's spawn also starts
    a resource tracker, which is not it). Children are listed by the thread that started them: a restarted engine is
    started from a worker thread."""
    children = [
        pid
        for task in pathlib.Path(f"/proc/{front_pid}/task").iterdir()
        for pid in (task / "children").read_text().split()
    ]
    engines = [
        int(pid)
        for pid in children
        if "resource_tracker" not in pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    ]
    assert len(engines) == 1, engines
    return engines[0]


def alive(pid: int) -> bool:
    try:
        return "zombie" not in pathlib.Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


def wait_until(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def restarts_metric(log_text: str) -> float:
    """modeld:engine_restarts_total, which the front counts (its endpoint outlives the engines)."""
    return total(scrape(log_text), "modeld:engine_restarts_total")


def test_an_engine_that_dies_fails_open_streams_and_is_restarted(default_model):
    with (
        run_memd(default_model, *MEMD_ARGS) as memd,
        run_modeld(memd, "--target-model", str(default_model), "--metrics-port", "0") as modeld,
        client.Client(modeld.address, timeout=30, max_retries=0) as c,
    ):
        assert c.health() == "SERVING" and restarts_metric(modeld.log_path.read_text()) == 0
        handle = c.stream("Tell me a long story.", max_new_tokens=600, temperature=0, ignore_eos=True)
        chunks = iter(handle)
        next(chunks)  # the request runs, holding slots in memd
        assert memd.capacity().running_requests == 1
        dead = engine_pid(modeld.pid)
        os.kill(dead, signal.SIGKILL)
        with pytest.raises(client.Unavailable, match="engine process stopped"):
            for _ in chunks:
                pass
        assert wait_until(lambda: c.health() == "NOT_SERVING", 10)
        with pytest.raises(client.Unavailable, match="engine process stopped"):
            c.generate("Hello", max_new_tokens=4, temperature=0)
        assert wait_until(lambda: c.health() == "SERVING", 120), "the engine was not restarted"
        assert not alive(dead) and not pathlib.Path(f"/proc/{dead}").exists()  # reaped: no zombie
        assert engine_pid(modeld.pid) != dead
        assert c.generate("Hello", max_new_tokens=4, temperature=0).completion_tokens == 4
        log_text = modeld.log_path.read_text()
        assert "the engine process exited unasked (code -9): restart 1 of at most" in log_text
        assert "the engine process serves again (restart 1)" in log_text
        assert restarts_metric(log_text) == 1
        assert total(settled(log_text), "modeld:request_success_total") >= 1  # the new engine's snapshots arrive
        assert is_idle(memd.wait_idle(10))  # the dead engine's session ended: its lease freed its slots


def test_an_engine_that_keeps_dying_makes_the_front_exit_1(default_model):
    with (
        run_memd(default_model, *MEMD_ARGS) as memd,
        run_modeld(memd, "--target-model", str(default_model)) as modeld,
        client.Client(modeld.address, timeout=30, max_retries=0) as c,
    ):
        for restart in range(1, MAX_RESTARTS + 1):
            os.kill(engine_pid(modeld.pid), signal.SIGKILL)
            assert wait_until(lambda: f"serves again (restart {restart})" in modeld.log_path.read_text(), 120)
            assert wait_until(lambda: c.health() == "SERVING", 10)
        os.kill(engine_pid(modeld.pid), signal.SIGKILL)  # one death more than the window allows
        assert modeld.wait(timeout=60) == 1
        assert f"after {MAX_RESTARTS} restarts within" in modeld.log_path.read_text()
        assert is_idle(memd.wait_idle(10))


def test_a_front_that_dies_takes_its_engine_with_it(default_model):
    with run_memd(default_model, *MEMD_ARGS) as memd, run_modeld(memd, "--target-model", str(default_model)) as modeld:
        engine = engine_pid(modeld.pid)
        with client.Client(modeld.address, timeout=30, max_retries=0) as c:
            handle = c.stream("Tell me a long story.", max_new_tokens=600, temperature=0, ignore_eos=True)
            next(iter(handle))
            modeld.send_signal(signal.SIGKILL)
            modeld.wait(timeout=10)
        assert wait_until(lambda: not alive(engine), 30), "the engine outlived its front"
        assert is_idle(memd.wait_idle(10))
        assert "Traceback" not in modeld.log_path.read_text()  # the engine says its front is gone in one line


def test_a_clean_stop_stops_the_engine_too(default_model):
    with run_memd(default_model, *MEMD_ARGS) as memd:
        with run_modeld(memd, "--target-model", str(default_model)) as modeld:
            engine = engine_pid(modeld.pid)
            with client.Client(modeld.address, timeout=30) as c:
                assert c.generate("Hello", max_new_tokens=4, temperature=0).completion_tokens == 4
        assert modeld.returncode == 0
        assert not alive(engine)
