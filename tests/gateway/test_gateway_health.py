"""The gateway's readiness (/health) follows its modelds' grpc.health, and a modeld that is not SERVING takes no new
request; liveness (/livez) answers whatever the modelds do. First with fake modelds whose health the test sets, then
end to end: a modeld whose memd is down answers GetInfo but not SERVING, and comes back when memd does."""

import json
import signal
import time
import urllib.error
import urllib.request

from tests.daemons import run_memd, run_modeld
from tests.gateway.conftest import MEMD_ARGS
from tests.gateway.fake_backends import FAKE_MODEL, fake_modelds
from tests.gateway.stack import run_gateway

POLL = 0.1  # run_gateway's --poll-interval


def get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return reply.status, json.load(reply)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def chat(url: str, model: str, text: str = "hi") -> tuple[int, dict, int]:
    """(status, body, x-modeld-index or -1) of one chat completion."""
    request = urllib.request.Request(
        f"{url}/v1/chat/completions",
        method="POST",
        headers={"Content-Type": "application/json"},
        data=json.dumps(
            {"model": model, "max_tokens": 4, "temperature": 0, "messages": [{"role": "user", "content": text}]}
        ).encode(),
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, json.load(reply), int(reply.headers["x-modeld-index"])
    except urllib.error.HTTPError as error:
        return error.code, json.load(error), -1


def wait_health(url: str, status: int, ready: int, timeout: float = 15.0) -> dict:
    """/health's body once it answers `status` with `ready` modelds (the gateway polls its modelds every POLL)."""
    deadline = time.monotonic() + timeout
    while True:
        got, body = get(f"{url}/health")
        if (got, body["modelds"]) == (status, ready) or time.monotonic() > deadline:
            assert (got, body["modelds"]) == (status, ready), body
            return body
        time.sleep(POLL / 2)


def test_health_is_readiness_by_grpc_health():
    with fake_modelds(2) as fakes, run_gateway(*(f.address for f in fakes)) as url:
        wait_health(url, 200, ready=2)
        fakes[0].set_serving(False)
        body = wait_health(url, 200, ready=1)
        assert body["backends"] == [
            {"index": 0, "health": "NOT_SERVING", "ready": False},
            {"index": 1, "health": "SERVING", "ready": True},
        ]
        before = fakes[0].servicer.attempts["Generate"]
        assert {chat(url, FAKE_MODEL, f"prompt {i}")[2] for i in range(8)} == {1}  # all on the serving one
        assert fakes[0].servicer.attempts["Generate"] == before

        fakes[1].set_serving(False)
        body = wait_health(url, 503, ready=0)
        assert body["status"] == "unavailable"
        assert "no modeld is ready" in body["message"] and {b["health"] for b in body["backends"]} == {"NOT_SERVING"}
        generates = [f.servicer.attempts["Generate"] for f in fakes]
        status, error, _ = chat(url, FAKE_MODEL)
        assert status == 503 and error["error"]["code"] == "unavailable" and error["error"]["type"]
        assert "is ready now" in error["error"]["message"]  # the gateway's own refusal: no modeld was asked
        assert [f.servicer.attempts["Generate"] for f in fakes] == generates
        assert get(f"{url}/livez") == (200, {"status": "alive"})

        fakes[0].set_serving(True)
        wait_health(url, 200, ready=1)
        assert chat(url, FAKE_MODEL)[::2] == (200, 0)


def test_health_reads_the_last_poll_and_asks_no_modeld():
    with fake_modelds(1) as fakes, run_gateway(fakes[0].address, args=("--poll-interval", "30")) as url:
        polled = fakes[0].servicer.attempts["GetInfo"]
        fakes[0].set_serving(False)
        for _ in range(20):
            assert get(f"{url}/health")[0] == 200  # the start-up poll's SERVING, until the next poll
        assert fakes[0].servicer.attempts["GetInfo"] == polled


def test_a_modeld_whose_memd_is_down_is_not_ready(default_model):
    memd_args = [a for a in MEMD_ARGS if a not in ("--metrics-port", "0")]
    with (
        run_memd(default_model, *memd_args) as memd,
        run_modeld(memd, "--target-model", str(default_model)) as modeld,
        run_gateway(modeld.address) as url,
    ):
        model = default_model.name
        wait_health(url, 200, ready=1)
        assert chat(url, model)[0] == 200
        memd.proc.send_signal(signal.SIGTERM)
        assert memd.proc.wait(timeout=10) == 0
        body = wait_health(url, 503, ready=0)
        assert body["backends"] == [{"index": 0, "health": "NOT_SERVING", "ready": False}]  # GetInfo still answers
        status, error, _ = chat(url, model)
        assert status == 503 and "is ready now" in error["error"]["message"]
        assert get(f"{url}/livez")[0] == 200
        with run_memd(default_model, *memd_args, address=memd.address) as again:
            wait_health(url, 200, ready=1, timeout=60)  # modeld re-attached to the new memd and says SERVING
            assert chat(url, model)[0] == 200
            again.wait_idle()
