"""The gateway's bounds on a request body (gateway/body_limit.py): a body over --max-body-bytes is refused with 413 in
OpenAI's error shape, whether its Content-Length declares it (before it is read) or it comes chunked (as soon as it
passes the bound), and the gateway closes the connection without reading the rest; a body that has not arrived
within --body-timeout of its headers is refused with 408. The stack's gateway runs at the defaults (8 MiB, 30 s), a
gateway of this module's own, in front of a fake modeld, at small bounds."""

import json

import pytest

from tests.gateway.fake_backends import FAKE_MODEL, fake_modelds
from tests.gateway.raw_http import chunked, post
from tests.gateway.stack import run_gateway

MiB = 1 << 20
DEFAULT_LIMIT = 8 * MiB
SMALL_LIMIT, TIMEOUT = 4096, 2.0
JSON = {"Content-Type": "application/json"}


def json_body(model: str, size: int, part: int = MiB):
    """A valid chat request of `size` bytes (its user turn padded with x), in parts of `part` bytes, made as sent."""
    head = json.dumps({"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": ""}]})[:-4].encode()
    tail = b'"}]}'
    left = size - len(head) - len(tail)
    yield head
    while left > 0:
        yield b"x" * min(part, left)
        left -= part
    yield tail


def assert_too_large(answer, size: int) -> None:
    assert answer.status == 413, answer
    assert answer.body["error"]["type"] == "invalid_request_error" and answer.body["error"]["param"] is None
    assert answer.body["error"]["code"] == "request_too_large" and answer.body["error"]["message"]
    assert answer.headers["connection"] == "close"
    assert answer.sent < size // 2  # answered and closed long before the body was sent: never read whole


@pytest.fixture(scope="module")
def small_gateway():
    with (
        fake_modelds(1) as fakes,
        run_gateway(
            fakes[0].address, args=("--max-body-bytes", str(SMALL_LIMIT), "--body-timeout", str(TIMEOUT))
        ) as url,
    ):
        yield url, fakes[0].servicer


def test_a_declared_100_mb_body_is_413_not_429(stack, model_name):
    size = 100_000_000
    answer = post(stack.url, "/v1/chat/completions", json_body(model_name, size), {**JSON, "Content-Length": str(size)})
    assert_too_large(answer, size)
    assert answer.body["error"]["message"] == f"the request body is {size} bytes: at most {DEFAULT_LIMIT}"
    assert all(c.info()["running_requests"] == 0 for c in stack.clients)


def test_a_chunked_100_mb_body_is_cut_at_the_limit(stack, model_name):
    size = 100_000_000
    answer = post(
        stack.url,
        "/v1/chat/completions",
        chunked(json_body(model_name, size)),
        {**JSON, "Transfer-Encoding": "chunked"},
    )
    assert_too_large(answer, size)
    assert (
        answer.body["error"]["message"] == f"the request body is larger than {DEFAULT_LIMIT} bytes, the gateway's limit"
    )


def test_a_body_at_the_limit_is_served_and_one_byte_more_is_not(small_gateway):
    url, fake = small_gateway
    at_limit = b"".join(json_body(FAKE_MODEL, SMALL_LIMIT))
    served = post(
        url, "/v1/chat/completions", [at_limit], {**JSON, "Content-Length": str(SMALL_LIMIT), "Connection": "close"}
    )
    assert served.status == 200 and served.body["object"] == "chat.completion", served
    over = b"".join(json_body(FAKE_MODEL, SMALL_LIMIT + 1))
    generates = fake.attempts["Generate"]
    for framing in ({"Content-Length": str(SMALL_LIMIT + 1)}, {"Transfer-Encoding": "chunked"}):
        parts = [over] if "Content-Length" in framing else chunked([over[:SMALL_LIMIT], over[SMALL_LIMIT:]])
        answer = post(url, "/v1/chat/completions", parts, {**JSON, **framing})
        assert answer.status == 413 and answer.body["error"]["code"] == "request_too_large", (framing, answer)
    assert fake.attempts["Generate"] == generates  # refused before any modeld saw it


def test_a_trickled_body_is_408_after_the_timeout(small_gateway):
    url, fake = small_gateway
    endless = chunked(b" " for _ in range(10_000))  # one byte every 50 ms: each read is quick, the body never ends
    answer = post(url, "/v1/chat/completions", endless, {**JSON, "Transfer-Encoding": "chunked"}, pause=0.05)
    assert answer.status == 408, answer
    assert answer.body["error"] == {
        "message": f"the request body did not arrive within {TIMEOUT:g} s",
        "type": "invalid_request_error",
        "param": None,
        "code": "request_timeout",
    }
    assert TIMEOUT <= answer.seconds < TIMEOUT + 2
    short = post(url, "/v1/chat/completions", [b"{"], {**JSON, "Content-Length": "100"})  # declares more than it sends
    assert short.status == 408 and TIMEOUT <= short.seconds < TIMEOUT + 2, short


def test_a_slow_body_within_the_timeout_is_served(small_gateway):
    url, _ = small_gateway
    body = b"".join(json_body(FAKE_MODEL, 1000))
    parts = [body[i : i + 100] for i in range(0, len(body), 100)]  # 10 parts, 0.1 s apart: within the timeout
    answer = post(
        url, "/v1/chat/completions", parts, {**JSON, "Content-Length": str(len(body)), "Connection": "close"}, pause=0.1
    )
    assert answer.status == 200 and answer.body["object"] == "chat.completion", answer
