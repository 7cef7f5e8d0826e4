"""The gateway's optional API key (gateway.api_key), with fake modelds: with GATEWAY_API_KEY in its environment, the
OpenAI routes answer 401 in OpenAI's shape without `Authorization: Bearer <key>` or with a wrong one, before the body
is read, and serve the openai package given the key; /health and /livez stay open for probes. Without the variable
nothing is asked."""

import json
import urllib.error
import urllib.request

import openai
import pytest

from tests.gateway.fake_backends import FAKE_MODEL, fake_modelds
from tests.gateway.stack import run_gateway
from tests.gateway.test_gateway_health import get, wait_health

KEY = "sk-test-0123456789"


def post(url: str, headers: dict) -> tuple[int, dict, dict]:
    request = urllib.request.Request(
        f"{url}/v1/chat/completions",
        method="POST",
        headers={"Content-Type": "application/json", **headers},
        data=json.dumps(
            {"model": FAKE_MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
        ).encode(),
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, json.load(reply), dict(reply.headers)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error), dict(error.headers)


def test_an_api_key_guards_the_openai_routes_and_not_the_probes(monkeypatch):
    monkeypatch.setenv("GATEWAY_API_KEY", KEY)
    with fake_modelds(1) as fakes, run_gateway(fakes[0].address) as url:
        wait_health(url, 200, ready=1)  # the probes need no key
        assert get(f"{url}/livez") == (200, {"status": "alive"})
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
            status, body, reply_headers = post(url, headers)
            assert status == 401 and body["error"]["code"] == "invalid_api_key", body
            assert reply_headers.get("www-authenticate") == "Bearer"
        assert fakes[0].servicer.attempts["Generate"] == 0  # nothing reached modeld
        assert post(url, {"Authorization": f"Bearer {KEY}"})[0] == 200
        with openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0) as api:
            assert api.models.list().data[0].id == FAKE_MODEL
        with (
            openai.OpenAI(base_url=f"{url}/v1", api_key="not it", max_retries=0) as api,
            pytest.raises(openai.AuthenticationError),
        ):
            api.models.list()


def test_without_a_key_nothing_is_asked(monkeypatch):
    monkeypatch.delenv("GATEWAY_API_KEY", raising=False)
    with fake_modelds(1) as fakes, run_gateway(fakes[0].address) as url:
        wait_health(url, 200, ready=1)
        assert post(url, {})[0] == 200
