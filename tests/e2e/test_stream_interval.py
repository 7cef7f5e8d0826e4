"""modeld's --stream-interval through the daemons (CPU): a stream's chunks carry that many new tokens, the last one
the rest; the chunks' ids and text add up to the result, for a request that ends by itself and for one aborted
with tokens held back; memd's pools end free."""

import time

import pytest

import client
from tests.daemons import is_idle, run_memd, run_modeld

INTERVAL = 4
MEMD_ARGS = [
    "--page-size",
    "1",
    "--max-running-requests",
    "4",
    "--max-total-tokens",
    "4096",
    "--draft-model",
    "none",
    "--kv-cache-dtype",
    "float32",
    "--strict",
]


@pytest.fixture(scope="module")
def daemons(default_model):
    with (
        run_memd(default_model, *MEMD_ARGS) as memd,
        run_modeld(memd, "--target-model", str(default_model), "--stream-interval", str(INTERVAL)) as modeld,
        client.Client(modeld.address, timeout=60) as c,
    ):
        yield memd, c
        deadline = time.monotonic() + 10
        while not is_idle(memd.capacity()) and time.monotonic() < deadline:
            time.sleep(0.05)
        memd.assert_idle_then_flush()


def test_chunks_hold_the_interval_and_add_up_to_the_result(daemons):
    _, c = daemons
    with c.stream("Count from one to twenty.", max_new_tokens=10, temperature=0, ignore_eos=True) as handle:
        chunks = list(handle)
    result = handle.result
    assert [len(chunk.token_ids) for chunk in chunks] == [4, 4, 2]
    assert [t for chunk in chunks for t in chunk.token_ids] == list(result.output_ids)
    assert "".join(chunk.text for chunk in chunks) == result.text
    assert result.finish_reason == "length"


def test_an_aborted_stream_gets_the_tokens_held_back(daemons):
    _, c = daemons
    with c.stream("Tell me a long story.", max_new_tokens=2000, temperature=0, ignore_eos=True) as handle:
        chunks = iter(handle)
        seen = [next(chunks)]
        assert len(seen[0].token_ids) == INTERVAL
        assert c.abort(handle.request_id) is True
        seen += list(chunks)
    result = handle.result
    assert result.finish_reason == "abort"
    assert [t for chunk in seen for t in chunk.token_ids] == list(result.output_ids)
    assert "".join(chunk.text for chunk in seen) == result.text
