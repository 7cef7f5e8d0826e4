"""The gateway's admission to one modeld (gateway.admission): at most its open-stream bound open, the rest queued in
order up to a bound and a wait, cancelled waiters leaving no trace, and a Retry-After that grows with the queue."""

import asyncio

import pytest

from gateway.admission import MAX_RETRY_AFTER, Admission, QueueFull


def run(coroutine):
    return asyncio.run(coroutine)


def test_places_up_to_the_limit_then_a_queue_served_in_order():
    async def scenario():
        admission = Admission(max_waiting=3, max_wait=5.0)
        admission.set_limit(2)
        await admission.enter()
        await admission.enter()
        order = []

        async def wait(name):
            await admission.enter()
            order.append(name)

        waiters = [asyncio.create_task(wait(name)) for name in "abc"]
        await asyncio.sleep(0.01)
        assert (admission.open, admission.waiting, order) == (2, 3, [])
        with pytest.raises(QueueFull, match="queue of 3 are full") as full:
            await admission.enter()
        assert full.value.retry_after >= 1
        admission.leave(1.0)
        await asyncio.sleep(0.01)
        assert (admission.open, admission.waiting, order) == (2, 2, ["a"])
        admission.leave(1.0)
        admission.leave(1.0)
        await asyncio.gather(*waiters)
        assert (admission.open, admission.waiting, order) == (2, 0, ["a", "b", "c"])

    run(scenario())


def test_a_wait_that_runs_out_or_is_cancelled_holds_nothing():
    async def scenario():
        admission = Admission(max_waiting=4, max_wait=0.05)
        admission.set_limit(1)
        await admission.enter()
        with pytest.raises(QueueFull, match="within 0.05 s"):
            await admission.enter()
        leaving = asyncio.create_task(admission.enter())
        await asyncio.sleep(0.01)
        leaving.cancel()  # the HTTP client went away while queued
        await asyncio.gather(leaving, return_exceptions=True)
        assert (admission.open, admission.waiting, len(admission.waiters)) == (1, 0, 0)
        admission.leave(0.5)
        assert admission.open == 0
        await admission.enter()  # the place freed goes to the next comer
        assert admission.open == 1

    run(scenario())


def test_a_raised_limit_admits_the_waiting_and_nothing_enters_before_the_first_poll():
    async def scenario():
        admission = Admission(max_waiting=2, max_wait=5.0)
        first = asyncio.create_task(admission.enter())  # limit 0: the modeld's bound is not known yet
        await asyncio.sleep(0.01)
        assert (admission.open, admission.waiting) == (0, 1)
        admission.set_limit(4)
        await first
        assert (admission.open, admission.waiting) == (1, 0)

    run(scenario())


def test_retry_after_grows_with_the_queue_and_the_hold_time_and_is_bounded():
    admission = Admission(max_waiting=1000, max_wait=5.0)
    admission.set_limit(4)
    short = admission.retry_after()
    for _ in range(50):  # requests have been holding their place for 20 s each
        admission.open += 1
        admission.leave(20.0)
    assert admission.retry_after() > short >= 1
    loop = asyncio.new_event_loop()
    admission.waiters.extend(loop.create_future() for _ in range(500))
    assert admission.retry_after() == MAX_RETRY_AFTER
    loop.close()
