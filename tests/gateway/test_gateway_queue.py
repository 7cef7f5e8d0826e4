"""Under overload the gateway queues, within bounds, and says when to come back: with fake modelds that report an
open-stream bound and hold their streams until the test lets them go, the gateway keeps at most that many open on a
modeld, queues the next --max-queued, refuses the rest at once with 429 and Retry-After, and a request that waits
past --queue-timeout gets the same; the queued ones are answered once places free."""

import json
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from tests.gateway.fake_backends import FAKE_MODEL, fake_modelds
from tests.gateway.stack import run_gateway
from tests.gateway.test_gateway_health import wait_health


def chat(url: str, text: str) -> tuple[int, dict, str | None]:
    """(status, body, Retry-After) of one chat completion."""
    request = urllib.request.Request(
        f"{url}/v1/chat/completions",
        method="POST",
        headers={"Content-Type": "application/json"},
        data=json.dumps(
            {"model": FAKE_MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": text}]}
        ).encode(),
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, json.load(reply), reply.headers.get("Retry-After")
    except urllib.error.HTTPError as error:
        return error.code, json.load(error), error.headers.get("Retry-After")


def wait_until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_the_gateway_queues_up_to_its_bound_and_refuses_the_rest_with_retry_after():
    with fake_modelds(1) as fakes:
        fake = fakes[0].servicer
        fake.max_open_streams = 2
        fake.proceed.clear()
        with (
            run_gateway(fakes[0].address, args=("--max-queued", "2", "--queue-timeout", "30")) as url,
            ThreadPoolExecutor(6) as pool,
        ):
            wait_health(url, 200, ready=1)
            answers = []
            done = threading.Lock()

            def one(i):
                got = chat(url, f"request {i}")
                with done:
                    answers.append(got)

            futures = [pool.submit(one, i) for i in range(6)]
            wait_until(lambda: len(answers) == 2 and fake.open_streams == 2)
            time.sleep(0.3)  # the queued two stay queued, and the modeld sees no third stream
            assert fake.open_streams == 2 and len(answers) == 2
            for status, body, retry_after in answers:
                assert status == 429 and body["error"]["code"] == "queue_full", body
                assert body["error"]["type"] == "rate_limit_error" and "queue of 2" in body["error"]["message"]
                assert retry_after is not None and int(retry_after) >= 1
            fake.proceed.set()
            for future in futures:
                future.result()
            assert sorted(status for status, _, _ in answers) == [200] * 4 + [429] * 2
            assert fake.most_open_streams == 2 and fake.attempts["Generate"] == 4


def test_a_request_that_waits_past_the_queue_timeout_is_refused_with_retry_after():
    with (
        fakes_held(open_streams=1) as (fake, address),
        run_gateway(address, args=("--queue-timeout", "0.5")) as url,
        ThreadPoolExecutor(1) as pool,
    ):
        wait_health(url, 200, ready=1)
        held = pool.submit(chat, url, "holds the only place")
        wait_until(lambda: fake.open_streams == 1)
        began = time.monotonic()
        status, body, retry_after = chat(url, "waits")
        assert status == 429 and "within 0.5 s" in body["error"]["message"] and int(retry_after) >= 1
        assert 0.4 < time.monotonic() - began < 5
        fake.proceed.set()
        assert held.result()[0] == 200
        assert fake.attempts["Generate"] == 1


class fakes_held:
    """One fake modeld reporting `open_streams` as its bound, holding its streams until `proceed` is set."""

    def __init__(self, open_streams: int):
        self.open_streams = open_streams

    def __enter__(self):
        self.context = fake_modelds(1)
        backend = self.context.__enter__()[0]
        backend.servicer.max_open_streams = self.open_streams
        backend.servicer.proceed.clear()
        return backend.servicer, backend.address

    def __exit__(self, *exc):
        return self.context.__exit__(*exc)
