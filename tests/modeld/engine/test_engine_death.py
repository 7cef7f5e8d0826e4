"""The engine thread never dies silently: a failure past every handler of a step (here a SystemExit out of the
scheduler, which the step's `except Exception` does not catch) calls the engine's on_death once, whose default turns
health NOT_SERVING; in modeld's engine process on_death tells the front at once (tests/e2e/test_engine_process.py
covers the front's side: every open stream fails with UNAVAILABLE). memd ends idle: the engine's session, closed,
frees what it held."""

import time

import pytest

from modeld.config import ModeldConfig
from modeld.engine.build import build_engine
from tests.daemons import is_idle, memd_args, run_memd


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the thread's exception, re-raised
def test_an_engine_thread_that_stops_unasked_turns_health_not_serving(default_model):
    with run_memd(default_model, *memd_args(max_running=4, budget=40_000_000, chunk=64)) as memd:
        health = []
        built = build_engine(ModeldConfig(memd=memd.address, target_model=str(default_model)), health.append)
        engine = built.engine
        deaths = []
        default_on_death = engine.on_death
        engine.on_death = lambda: (deaths.append(True), default_on_death())

        def next_step():
            raise SystemExit("a failure no step handler catches")

        engine.scheduler.next_step = next_step
        try:
            engine.start()
            engine.thread.join(timeout=30)
            assert not engine.thread.is_alive()
            assert deaths == [True]
            assert health[-1] is False, "the engine thread stopped and health still says SERVING"
        finally:
            engine.stopped.set()
            built.link.close()
        deadline = time.monotonic() + 10
        while not is_idle(memd.capacity()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert is_idle(memd.capacity())
