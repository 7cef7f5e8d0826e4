"""memd and modeld as separate processes, the client against them: greedy output equals
Hugging Face generate token for token (fp32, CPU), alone and 8 at a time; streaming yields the
same tokens; bad input gets INVALID_ARGUMENT; a cancelled stream frees its slots; memd's pools
are fully free after every test."""

import concurrent.futures

import pytest

import client
from tests.daemons import is_idle, run_memd, run_modeld

MAX_NEW = 24
GPU = pytest.mark.gpu
SETUPS = [
    pytest.param(("cpu", 1), id="cpu-page1"),
    pytest.param(("cpu", 64), id="cpu-page64"),
    pytest.param(("cuda", 1), id="cuda-page1", marks=GPU),
    pytest.param(("cuda", 64), id="cuda-page64", marks=GPU),
]


@pytest.fixture(scope="module", params=SETUPS)
def daemons(request, default_model):
    device, page = request.param
    dtype = "float32" if device == "cpu" else "bfloat16"
    args = [
        "--page-size",
        str(page),
        "--max-running-requests",
        "8",
        "--max-total-tokens",
        "8192",
        "--draft-model",
        "none",
        "--kv-cache-dtype",
        dtype,
        "--strict",
    ]
    with (
        run_memd(default_model, *args, device=device) as memd,
        run_modeld(memd, "--target-model", str(default_model), device=device) as modeld,
    ):
        with client.Client(modeld.address, timeout=300) as c:
            yield memd, modeld, c, device


@pytest.fixture(autouse=True)
def pools_free_after(daemons):
    yield
    memd = daemons[0]
    memd.assert_idle_then_flush(timeout=5)


def test_greedy_matches_hf_one_at_a_time(daemons, chat_ids, assert_greedy_equal):
    c, device = daemons[2], daemons[3]
    for ids in chat_ids[:4]:
        result = c.generate(input_ids=ids, max_new_tokens=MAX_NEW, temperature=0)
        assert_greedy_equal(list(result.output_ids), ids, MAX_NEW, device)
        assert result.prompt_tokens == len(ids) and result.completion_tokens == len(result.output_ids)
        assert result.finish_reason in ("stop", "length")


def test_greedy_matches_hf_eight_concurrent(daemons, chat_ids, assert_greedy_equal):
    c, device = daemons[2], daemons[3]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda ids: c.generate(input_ids=ids, max_new_tokens=MAX_NEW, temperature=0), chat_ids))
    for ids, result in zip(chat_ids, results):
        assert_greedy_equal(list(result.output_ids), ids, MAX_NEW, device)


def test_text_prompt_with_chat_template(daemons, chat_ids):
    c = daemons[2]
    by_text = c.generate("What is the capital of France?", chat=True, max_new_tokens=MAX_NEW, temperature=0)
    by_ids = c.generate(input_ids=chat_ids[0], max_new_tokens=MAX_NEW, temperature=0)
    assert by_text.output_ids == by_ids.output_ids and by_text.prompt_tokens == len(chat_ids[0])
    assert by_text.text == by_ids.text and by_text.text.strip()


def test_stream_yields_the_same_tokens(daemons, chat_ids, assert_greedy_equal):
    c, device = daemons[2], daemons[3]
    ids = chat_ids[1]
    with c.stream(input_ids=ids, max_new_tokens=MAX_NEW, temperature=0) as handle:
        chunks = list(handle)
    result = handle.result
    assert [t for chunk in chunks for t in chunk.token_ids] == list(result.output_ids)
    assert result.output_ids == c.generate(input_ids=ids, max_new_tokens=MAX_NEW, temperature=0).output_ids
    assert_greedy_equal(list(result.output_ids), ids, MAX_NEW, device)
    assert "".join(chunk.text for chunk in chunks) == result.text
    assert len(chunks) > 1


def test_stop_string_cuts_the_text(daemons, chat_ids):
    c = daemons[2]
    full = c.generate(input_ids=chat_ids[0], max_new_tokens=MAX_NEW, temperature=0, ignore_eos=True).text
    words = full.split()
    stop = words[len(words) // 2]  # a word from the middle of the model's own answer
    result = c.generate(input_ids=chat_ids[0], max_new_tokens=MAX_NEW, temperature=0, ignore_eos=True, stop=[stop])
    assert result.finish_reason == "stop" and result.matched_stop == stop
    assert result.text == full[: full.index(stop)]


@pytest.mark.parametrize(
    "kwargs, message",
    [
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
    ],
)
def test_invalid_input_gets_invalid_argument(daemons, kwargs, message):
    c = daemons[2]
    kwargs = dict(kwargs)
    prompt = kwargs.pop("prompt", None)
    with pytest.raises(client.InvalidArgument, match=message):
        c.generate(prompt, **kwargs)


def test_cancelled_stream_frees_its_slots(daemons):
    memd, _, c, _ = daemons
    handle = c.stream("Tell me a long story.", max_new_tokens=2000, temperature=0, ignore_eos=True)
    chunks = iter(handle)
    next(chunks), next(chunks)
    assert memd.capacity().target.held_by_requests > 0
    handle.cancel()
    cap = memd.wait_idle(timeout=5)  # its slots are free or, its computed prefix, in the prefix cache
    assert is_idle(cap), cap
    assert c.capacity()["running_requests"] == 0
