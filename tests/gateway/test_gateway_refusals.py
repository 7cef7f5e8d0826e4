"""modeld's refusals through the gateway, end to end, on a stack of their own: a modeld with no stream left
(RESOURCE_EXHAUSTED) answers 429, a modeld that died answers 503, both in OpenAI's error shape."""

import time

import openai
import pytest

import client
from tests.daemons import run_memd, run_modeld
from tests.gateway.conftest import MEMD_ARGS
from tests.gateway.stack import run_gateway

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def refusal(api: openai.OpenAI, model: str) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as caught:
        api.chat.completions.create(model=model, messages=QUESTION, max_tokens=4, temperature=0)
    return caught.value


def test_no_stream_left_is_429_and_a_dead_modeld_is_503(default_model):
    memd_args = [a for a in MEMD_ARGS if a not in ("--metrics-port", "0")]
    with (
        run_memd(default_model, *memd_args) as memd,
        run_modeld(memd, "--target-model", str(default_model), "--max-open-streams", "1") as modeld,
        run_gateway(modeld.address) as url,
        openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60) as api,
    ):
        model = default_model.name
        assert api.chat.completions.create(model=model, messages=QUESTION, max_tokens=4, temperature=0).choices
        with client.Client(modeld.address, timeout=120) as c:
            with c.stream(
                "Tell me a very long story.", chat=True, max_new_tokens=400, temperature=0, ignore_eos=True
            ) as held:
                next(iter(held))  # modeld's only stream is open
                error = refusal(api, model)
                assert error.status_code == 429 and error.body["type"] == "rate_limit_error" and error.body["message"]
                assert int(error.response.headers["retry-after"]) >= 1
        modeld.kill()
        modeld.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            error = refusal(api, model)
            if error.status_code == 503:
                break
            time.sleep(0.1)
        assert error.status_code == 503 and error.body["code"] == "unavailable", error.body
        assert int(error.response.headers["retry-after"]) >= 1
