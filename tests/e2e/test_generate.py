"""memd and modeld as separate processes, the client against them: greedy output equals
Hugging Face generate token for token (fp32, CPU), alone and 8 at a time; streaming yields the
same tokens; bad input gets INVALID_ARGUMENT; a cancelled stream frees its slots; memd's pools
are fully free after every test."""

import concurrent.futures
import time

import pytest

import client
from tests.daemons import memd_args, run_memd, run_modeld

MAX_NEW = 24


@pytest.fixture(scope="module", params=[1, 64], ids=["page1", "page64"])
def daemons(request, default_model):
    args = ["--page-size", str(request.param), "--max-running-requests", "8", "--max-total-tokens", "8192",
            "--draft-model", "none", "--kv-cache-dtype", "float32", "--strict"]
    with run_memd(default_model, *args) as memd, run_modeld(memd, "--target-model", str(default_model)) as modeld:
        with client.Client(modeld.address, timeout=300) as c:
            yield memd, modeld, c


@pytest.fixture(autouse=True)
def pools_free_after(daemons):
    yield
    memd = daemons[0]
    cap = memd.wait_all_free(timeout=5)
    assert cap.target.free == cap.target.total and cap.running_requests == 0, cap


def test_greedy_matches_hf_one_at_a_time(daemons, chat_ids, hf_greedy):
    c = daemons[2]
    for ids in chat_ids[:4]:
        result = c.generate(input_ids=ids, max_new_tokens=MAX_NEW, temperature=0)
        assert list(result.output_ids) == hf_greedy(ids, MAX_NEW)
        assert result.prompt_tokens == len(ids) and result.completion_tokens == len(result.output_ids)
        assert result.finish_reason in ("stop", "length")


def test_greedy_matches_hf_eight_concurrent(daemons, chat_ids, hf_greedy):
    c = daemons[2]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda ids: c.generate(input_ids=ids, max_new_tokens=MAX_NEW, temperature=0), chat_ids))
    for ids, result in zip(chat_ids, results):
        assert list(result.output_ids) == hf_greedy(ids, MAX_NEW)


def test_text_prompt_with_chat_template(daemons, chat_ids, hf_greedy):
    c = daemons[2]
    result = c.generate("What is the capital of France?", chat=True, max_new_tokens=MAX_NEW, temperature=0)
    assert list(result.output_ids) == hf_greedy(chat_ids[0], MAX_NEW)
    assert "Paris" in result.text


def test_stream_yields_the_same_tokens(daemons, chat_ids, hf_greedy):
    c = daemons[2]
    ids = chat_ids[1]
    with c.stream(input_ids=ids, max_new_tokens=MAX_NEW, temperature=0) as handle:
        chunks = list(handle)
    result = handle.result
    assert [t for chunk in chunks for t in chunk.token_ids] == list(result.output_ids) == hf_greedy(ids, MAX_NEW)
    assert "".join(chunk.text for chunk in chunks) == result.text
    assert len(chunks) > 1


def test_stop_string_cuts_the_text(daemons):
    c = daemons[2]
    result = c.generate("What is the capital of France?", chat=True, max_new_tokens=MAX_NEW, temperature=0, stop=["Paris"])
    assert result.finish_reason == "stop" and result.matched_stop == "Paris"
    assert result.text == "The capital of France is "


@pytest.mark.parametrize("kwargs, message", [
    (dict(prompt=""), "empty"),
    (dict(input_ids=[]), "empty"),
    (dict(input_ids=[1, 2, 49152]), "outside the vocabulary"),
    (dict(input_ids=[1, -1]), "outside the vocabulary"),
    (dict(prompt="hi", max_new_tokens=0), "max_new_tokens"),
    (dict(prompt="hi", max_new_tokens=8192), "exceeds the context"),
    (dict(prompt="hi", temperature=-0.5), "temperature"),
    (dict(prompt="hi", top_p=0.0), "top_p"),
    (dict(prompt="hi", top_p=1.5), "top_p"),
    (dict(prompt="hi", top_k=-2), "top_k"),
])
def test_invalid_input_gets_invalid_argument(daemons, kwargs, message):
    c = daemons[2]
    kwargs = dict(kwargs)
    prompt = kwargs.pop("prompt", None)
    with pytest.raises(client.InvalidArgument, match=message):
        c.generate(prompt, **kwargs)


def test_cancelled_stream_frees_its_slots(daemons):
    memd, _, c = daemons
    handle = c.stream("Tell me a long story.", max_new_tokens=2000, temperature=0, ignore_eos=True)
    chunks = iter(handle)
    next(chunks), next(chunks)
    assert memd.capacity().target.used > 0
    handle.cancel()
    deadline = time.monotonic() + 5
    while memd.capacity().target.used and time.monotonic() < deadline:
        time.sleep(0.05)
    assert memd.capacity().target.used == 0
    assert c.capacity()["running_requests"] == 0
