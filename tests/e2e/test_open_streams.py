"""Open streams never starve modeld's other RPCs: with as many Generate streams open as modeld allows, health,
GetInfo and Abort still answer at once, and one more stream is refused with RESOURCE_EXHAUSTED (not queued behind
the others); once the streams end, new ones are served and memd is idle."""

import time

import pytest

import client
from tests.daemons import memd_args, run_memd, run_modeld

LIMIT = 3


def test_streams_at_the_bound_leave_health_info_and_abort_responsive(default_model):
    args = memd_args(max_running=LIMIT, budget=40_000_000, chunk=64)
    with (
        run_memd(default_model, *args) as memd,
        run_modeld(memd, "--target-model", str(default_model), "--max-open-streams", str(LIMIT)) as modeld,
        client.Client(modeld.address, timeout=30) as c,
    ):
        handles = [
            c.stream("Tell me a long story.", max_new_tokens=800, temperature=0, ignore_eos=True) for _ in range(LIMIT)
        ]
        chunks = [iter(h) for h in handles]
        for it in chunks:  # every stream open and running
            next(it)
        for _ in range(10):
            begin = time.monotonic()
            assert c.health() == "SERVING"
            assert c.info()["max_running_requests"] == LIMIT
            assert time.monotonic() - begin < 0.5  # two round trips; each well under the 100 ms when idle
        with pytest.raises(client.ResourceExhausted, match="too many open Generate streams"):
            next(iter(c.stream("one too many", max_new_tokens=4, temperature=0)))
        for h in handles:
            h.cancel()
        deadline = time.monotonic() + 5  # a cancelled stream's slot frees once modeld has aborted its request
        while True:
            try:
                again = c.generate("What is the capital of France?", chat=True, max_new_tokens=4, temperature=0)
                break
            except client.ResourceExhausted:
                assert time.monotonic() < deadline, "cancelled streams still count against the bound"
                time.sleep(0.05)
        assert again.completion_tokens == 4
