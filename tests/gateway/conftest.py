"""One stack for the gateway and metrics tests: memd, two modelds on it (metrics on), the gateway in front of both.
After every test, modeld runs nothing and memd holds nothing but its prefix cache, which is then flushed."""

import time

import pytest

import client
from tests.daemons import run_memd, run_modeld
from tests.gateway.stack import run_gateway

MEMD_ARGS = [
    "--page-size",
    "1",
    "--max-running-requests",
    "8",
    "--max-total-tokens",
    "8192",
    "--draft-model",
    "none",
    "--kv-cache-dtype",
    "float32",
    "--strict",
    "--metrics-port",
    "0",
]


class Stack:
    def __init__(self, memd, modelds, url):
        self.memd, self.modelds, self.url = memd, modelds, url
        self.clients = [client.Client(m.address, timeout=30) for m in modelds]

    def wait_modelds_idle(self, timeout: float = 5.0) -> list[dict]:
        deadline = time.monotonic() + timeout
        while True:
            infos = [c.info() for c in self.clients]
            if all(i["running_requests"] == i["waiting_requests"] == 0 for i in infos) or time.monotonic() > deadline:
                return infos


@pytest.fixture(scope="session")
def stack(default_model):
    with (
        run_memd(default_model, *MEMD_ARGS) as memd,
        run_modeld(memd, "--target-model", str(default_model), "--metrics-port", "0", name="modeld-a") as a,
        run_modeld(memd, "--target-model", str(default_model), "--metrics-port", "0", name="modeld-b") as b,
        run_gateway(a.address, b.address) as url,
    ):
        s = Stack(memd, [a, b], url)
        yield s
        for c in s.clients:
            c.close()


@pytest.fixture(autouse=True)
def memd_idle_after(request):
    yield
    if "stack" not in request.fixturenames:
        return
    s = request.getfixturevalue("stack")
    infos = s.wait_modelds_idle()
    assert all(i["running_requests"] == i["waiting_requests"] == 0 for i in infos), infos
    s.memd.assert_idle_then_flush()


@pytest.fixture
def openai_client(stack):
    import openai

    with openai.OpenAI(base_url=f"{stack.url}/v1", api_key="unused", max_retries=0, timeout=60) as c:
        yield c


@pytest.fixture(scope="session")
def model_name(default_model):
    return default_model.name
