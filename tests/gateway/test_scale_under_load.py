"""Scaling the modeld replicas from 1 to 2 under a running load, through the real daemons (CPU, the default model):
two modelds on one memd listen on 127.0.0.1 and 127.0.0.2 at one port, behind a DNS name whose answer the test
changes from the first alone to both while clients send requests back to back, as a headless Service's answer
changes when a pod becomes ready. The gateway runs in this process (its app as served, with the test's resolver in
place of the system's). No request is lost, the requests sent after the change reach the new replica too, and memd
ends with nothing held (run_memd)."""

import concurrent.futures
import json
import socket
import threading
import time
import urllib.request

import pytest
import uvicorn

from gateway.app import create_app
from gateway.config import config_from_args
from gateway.discovery import parse_name
from gateway.server import bind
from tests.daemons import run_memd, run_modeld

NAME = "dns:///modelds.default.svc:{port}"
HOSTS = ("127.0.0.1", "127.0.0.2")
CLIENTS, REQUESTS, SWITCH_AFTER = 3, 18, 4


class ChangingName:
    """A resolver whose answer the test sets (what Kubernetes' DNS answers for a headless Service)."""

    def __init__(self, addresses: list[str]):
        self.addresses = list(addresses)

    async def __call__(self, host: str, port: int) -> list[str]:
        return list(self.addresses)


def port_free_on_both() -> int:
    """A port free on both loopback addresses (Linux routes all of 127.0.0.0/8 to the loopback device)."""
    for _ in range(20):
        with socket.socket() as first:
            first.bind((HOSTS[0], 0))
            port = first.getsockname()[1]
            try:
                with socket.socket() as second:
                    second.bind((HOSTS[1], port))
                    return port
            except OSError:
                continue
    pytest.skip("no port free on both 127.0.0.1 and 127.0.0.2")


class InProcessGateway:
    """The gateway's app under uvicorn on a thread of this process, on a free loopback port."""

    def __init__(self, app):
        self.sock = bind("127.0.0.1", 0)
        self.url = "http://127.0.0.1:%d" % self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the gateway did not start"
            time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=30)


def test_a_replica_added_under_load_takes_new_requests_and_none_is_lost(default_model):
    port = port_free_on_both()
    name = NAME.format(port=port)
    first, second = (f"{host}:{port}" for host in HOSTS)
    with (
        run_memd(default_model) as memd,
        run_modeld(memd, "--target-model", str(default_model), "--listen", first, name="modeld-a"),
        run_modeld(memd, "--target-model", str(default_model), "--listen", second, name="modeld-b"),
    ):
        answers = ChangingName([first])
        cfg = config_from_args(["--modeld", name, "--port", "0", "--poll-interval", "0.1"])
        assert parse_name(name) == ("modelds.default.svc", port)
        listed, switched = threading.Event(), threading.Event()  # the name lists both; and it has been resolved
        with InProcessGateway(create_app(cfg, resolver=answers, resolve_interval=0.1)) as gateway:

            def ask(i: int) -> tuple[str, int, str]:
                # sent before the name listed both, once it was resolved and polled, or in between (no claim)
                when = "after" if switched.is_set() else "between" if listed.is_set() else "before"
                body = {
                    "model": default_model.name,
                    "messages": [{"role": "user", "content": f"Name {i + 1} colours."}],
                    "max_tokens": 8,
                    "temperature": 0,
                }
                request = urllib.request.Request(
                    f"{gateway.url}/v1/chat/completions",
                    data=json.dumps(body).encode(),
                    headers={"content-type": "application/json"},
                )
                with urllib.request.urlopen(request, timeout=120) as reply:  # raises on any status but 2xx
                    index, answer = int(reply.headers["x-modeld-index"]), json.loads(reply.read())
                if i + 1 == SWITCH_AFTER:  # a few requests done: the new replica's pod becomes ready
                    answers.addresses = [first, second]
                    listed.set()
                    time.sleep(0.5)  # several resolve and poll intervals: it is listed and polled
                    switched.set()
                return when, index, answer["choices"][0]["message"]["content"]

            with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
                done = list(pool.map(ask, range(REQUESTS)))
    assert len(done) == REQUESTS and all(text for _, _, text in done), "a request was lost or empty"
    before = {index for when, index, _ in done if when == "before"}
    after = [index for when, index, _ in done if when == "after"]
    assert before == {0}, "a request reached a replica the name did not list yet"
    assert after and 1 in after, f"no request sent after the change reached the new replica: {after}"
