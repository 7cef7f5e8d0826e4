"""The client against memd and modeld deployed as a user deploys them: in two containers of compose.yaml
(+ compose.cpu.yaml, podman-compose) and, with the same tests, as two plain processes. Over loopback TCP:
greedy output equals Hugging Face's (the in-process reference of tests/e2e), streaming, capacity and health;
the OpenAI-compatible gateway in front of modeld answers a chat
completion with the client's greedy text; kill -9 of modeld mid-stream (the client gets UNAVAILABLE at once, memd
frees the session within 2 s, a
restarted modeld answers the same greedy output); memd stopped and started again (modeld turns NOT_SERVING,
then SERVING); a stop is a clean SIGTERM that leaves no segment in /dev/shm. Every test ends with memd's pools
free (nothing held but by the prefix cache; fully free after FlushCache)."""

import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

import client
from tests.daemons import REPO, child_env, is_idle
from tests.integration.stacks import probe, wait_until

MAX_NEW = 16


@pytest.fixture
def c(stack):
    with client.Client(stack.modeld_address, timeout=120) as c:
        yield c


@pytest.fixture(autouse=True)
def pools_free_after(stack):
    yield
    if not getattr(stack, "stopped", False):
        stack.memd.assert_idle_then_flush(timeout=5)


def test_greedy_equals_the_in_process_reference(stack, c, chat_ids, assert_greedy_equal):
    for ids in chat_ids[:3]:
        result = c.generate(input_ids=ids, max_new_tokens=MAX_NEW, temperature=0)
        assert_greedy_equal(list(result.output_ids), ids, MAX_NEW, "cpu")
        assert result.prompt_tokens == len(ids) and result.completion_tokens == len(result.output_ids)
    # The README's client call, as typed there (the CLI), against this stack.
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "client",
            "--addr",
            stack.modeld_address,
            "generate",
            "What is the capital of France?",
            "--chat",
            "--max-new-tokens",
            "32",
            "--temperature",
            "0",
        ],
        capture_output=True,
        text=True,
        env=child_env(),
        cwd=REPO,
        timeout=120,
    )
    assert out.returncode == 0 and "Paris" in out.stdout, out.stdout + out.stderr


def test_stream_yields_the_greedy_tokens(stack, c, chat_ids, assert_greedy_equal):
    ids = chat_ids[1]
    with c.stream(input_ids=ids, max_new_tokens=MAX_NEW, temperature=0) as handle:
        chunks = list(handle)
    assert len(chunks) > 1
    assert [t for chunk in chunks for t in chunk.token_ids] == list(handle.result.output_ids)
    assert "".join(chunk.text for chunk in chunks) == handle.result.text
    assert_greedy_equal(list(handle.result.output_ids), ids, MAX_NEW, "cpu")


def test_capacity_and_health(stack, c):
    assert c.health() == "SERVING"
    for address in (stack.memd_address, stack.modeld_address):
        code, line = probe(address)
        assert code == 0 and line == f"{address}: SERVING"
    if stack.kind == "containers":  # compose.yaml's health checks, run by podman in the containers
        assert stack.healthcheck("memd") == 0 and stack.healthcheck("modeld") == 0
    cap = c.capacity()
    target = cap["memd"]["target"]
    assert int(target["total"]) > 0 and int(target["free"]) + int(target.get("evictable", 0)) == int(target["total"])
    direct = stack.memd.capacity()
    assert direct.target.total == int(target["total"]) and direct.running_requests == 0


def gateway_healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as answer:
            return answer.status == 200
    except (urllib.error.URLError, OSError):
        return False


def test_gateway_answers_as_the_client_does(stack, c):
    question = "What is the capital of France?"
    expected = c.generate(question, chat=True, max_new_tokens=MAX_NEW, temperature=0).text
    wait_until(lambda: gateway_healthy(stack.gateway_url), 120, "the gateway healthy", interval=0.5)
    if stack.kind == "containers":  # compose.yaml's health check of the gateway, run by podman
        assert stack.healthcheck("gateway") == 0
    body = {
        "model": "SmolLM2-135M-Instruct",
        "messages": [{"role": "user", "content": question}],
        "max_tokens": MAX_NEW,
        "temperature": 0,
    }
    request = urllib.request.Request(
        f"{stack.gateway_url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as answer:
        reply = json.loads(answer.read())
    assert reply["choices"][0]["message"]["content"] == expected
    assert reply["usage"]["completion_tokens"] == MAX_NEW or reply["choices"][0]["finish_reason"] == "stop"


def test_kill_9_of_modeld_mid_stream(stack, c, chat_ids):
    ids = chat_ids[2]
    before = c.generate(input_ids=ids, max_new_tokens=MAX_NEW, temperature=0).output_ids
    stack.memd.flush_and_wait_free()
    errors, killed_at, failed_at = [], [], []
    with c.stream(input_ids=ids, max_new_tokens=400, temperature=0, ignore_eos=True) as handle:
        got_first = threading.Event()

        def consume():
            try:
                for _ in handle:
                    got_first.set()
            except client.ClientError as exc:
                failed_at.append(time.monotonic())
                errors.append(exc)
            got_first.set()

        reader = threading.Thread(target=consume)
        reader.start()
        assert got_first.wait(120), "no token before the kill"
        assert stack.memd.capacity().running_requests == 1
        stack.kill_modeld()
        killed_at.append(time.monotonic())
        # memd frees the dead session's slots within 2 s of the kill.
        cap = wait_until(
            lambda: (lambda cap: cap if is_idle(cap) else None)(stack.memd.capacity()),
            2.0,
            "memd idle after kill -9 of modeld",
            interval=0.02,
        )
        assert cap.running_requests == 0
        reader.join(30)
    assert not reader.is_alive(), "the stream hung after modeld died"
    assert len(errors) == 1 and isinstance(errors[0], client.Unavailable), errors
    assert failed_at[0] - killed_at[0] < 5.0, "the client learnt of modeld's death late"
    with pytest.raises(client.Unavailable):
        c.generate(input_ids=ids, max_new_tokens=2, temperature=0, timeout=3)
    stack.start_modeld()
    # The client's channel reconnects on gRPC's back-off (which grows while modeld was down): wait for it.
    wait_until(lambda: c.health() == "SERVING", 60, "the client reconnected to the restarted modeld", interval=0.5)
    assert c.generate(input_ids=ids, max_new_tokens=MAX_NEW, temperature=0).output_ids == before


def test_memd_stopped_and_started_again(stack, c, chat_ids):
    ids = chat_ids[0]
    before = c.generate(input_ids=ids, max_new_tokens=MAX_NEW, temperature=0).output_ids
    stack.stop_memd()
    wait_until(lambda: c.health() == "NOT_SERVING", 20, "modeld NOT_SERVING while memd is gone")
    with pytest.raises(client.Unavailable):
        c.generate(input_ids=ids, max_new_tokens=2, temperature=0, timeout=5)
    stack.start_memd()
    wait_until(lambda: c.health() == "SERVING", 120, "modeld SERVING again", interval=0.2)
    assert c.generate(input_ids=ids, max_new_tokens=MAX_NEW, temperature=0).output_ids == before


def test_stop_is_a_clean_sigterm_and_leaves_no_segment(stack, c):
    assert stack.memd_segments(), "memd's CPU pools should be segments in /dev/shm"
    stack.memd.assert_idle_then_flush(timeout=5)
    codes = stack.stop()
    stack.stopped = True
    assert codes == {"modeld": 0, "memd": 0}, f"not a clean stop: {codes}\n{stack.logs()}"
    assert stack.memd_segments() == []
    assert "memd stopped; shared segments released" in stack.logs()
