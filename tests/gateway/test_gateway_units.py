"""The gateway's parts without daemons: error mapping, routing by load and prefix affinity, a modeld's readiness,
configuration."""

import asyncio

import pytest

from client.errors import error_for
from gateway.admission import Admission
from gateway.backends import Backend
from gateway.config import config_from_args
from gateway.errors import from_client_error
from gateway.router import Router


@pytest.mark.parametrize(
    "code, status",
    [("INVALID_ARGUMENT", 400), ("RESOURCE_EXHAUSTED", 429), ("UNAVAILABLE", 503), ("INTERNAL", 500), ("UNKNOWN", 500)],
)
def test_grpc_codes_become_http_statuses(code, status):
    error = from_client_error(error_for(code, "why"), retry_after=7)
    assert (error.status, error.message, error.code) == (status, "why", code.lower())
    assert error.retry_after == (7 if status in (429, 503) else None)  # only a refusal for now says when to retry


class FakeBackend:
    def __init__(self, index, load=0):
        self.index, self.load = index, load


def test_least_loaded_then_affinity_until_imbalanced():
    router = Router(block_chars=8, max_entries=100, max_imbalance=2)
    a, b = FakeBackend(0, load=3), FakeBackend(1, load=1)
    assert router.pick("system prompt, question one", [a, b]) is b
    b.load = 3
    assert router.pick("system prompt, question two", [a, b]) is b  # shares 'system p' with the first: affinity
    a.load = 0
    assert router.pick("system prompt, question three", [a, b]) is a  # b has 3 - 0 > 2 more: the least loaded
    assert router.pick("something else entirely", [a, b]) is a  # no shared prefix


def test_affinity_map_is_bounded():
    router = Router(block_chars=4, max_entries=5, max_imbalance=0)
    backend = FakeBackend(0)
    for i in range(20):
        router.pick(f"prompt number {i}", [backend])
    assert len(router.recent) == 5


def test_a_modeld_is_ready_only_while_serving_and_not_after_an_unavailable_refusal():
    async def states() -> list[bool]:
        backend = Backend(
            0, "unix:///nonexistent/modeld.sock", request_timeout=1.0, admission=Admission(max_waiting=1, max_wait=1.0)
        )
        seen = [backend.ready]  # nothing polled yet
        backend.reachable, backend.health = True, "NOT_SERVING"  # answers GetInfo, but its engine or memd is gone
        seen.append(backend.ready)
        backend.health = "SERVING"
        seen.append(backend.ready)
        backend.refused_unavailable()  # until the next poll says SERVING again
        seen.append(backend.ready)
        await backend.client.close()
        return seen

    assert asyncio.run(states()) == [False, False, True, False]


def test_config_refuses_bad_flags():
    with pytest.raises(ValueError, match="--modeld"):
        config_from_args(["--modeld", "nowhere"])
    with pytest.raises(ValueError, match="twice"):
        config_from_args(["--modeld", "127.0.0.1:1", "--modeld", "127.0.0.1:1"])
    assert config_from_args(["--modeld", "unix:///tmp/m.sock"]).port == 8000
    with pytest.raises(ValueError, match="--max-body-bytes must be >= 1, got 0"):
        config_from_args(["--modeld", "unix:///tmp/m.sock", "--max-body-bytes", "0"])
    with pytest.raises(ValueError, match="--body-timeout must be > 0 seconds, got 0.0"):
        config_from_args(["--modeld", "unix:///tmp/m.sock", "--body-timeout", "0"])
    defaults = config_from_args(["--modeld", "unix:///tmp/m.sock"])
    assert (defaults.max_body_bytes, defaults.body_timeout) == (8 << 20, 30.0)


def test_a_blank_api_key_is_refused_and_a_key_never_shows_in_the_config(monkeypatch):
    monkeypatch.setenv("GATEWAY_API_KEY", "  ")
    with pytest.raises(ValueError, match="GATEWAY_API_KEY"):
        config_from_args(["--modeld", "127.0.0.1:1"])
    monkeypatch.setenv("GATEWAY_API_KEY", "sk-secret")
    cfg = config_from_args(["--modeld", "127.0.0.1:1"])
    assert cfg.api_key == "sk-secret" and "sk-secret" not in repr(cfg)
