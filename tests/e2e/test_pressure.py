"""A KV pool far smaller than the load: requests wait or are preempted and recomputed, and every
greedy output still equals Hugging Face generate; nothing leaks."""

import concurrent.futures
import re

import client
from tests.daemons import run_memd, run_modeld

MAX_NEW = 40


def test_small_pool_preempts_without_changing_greedy_output(default_model, chat_ids, hf_greedy):
    # 6 requests of ~60-75 tokens each at the end, in a pool of 192 tokens: at most about 3 fit at once.
    args = [
        "--page-size",
        "16",
        "--max-running-requests",
        "6",
        "--max-total-tokens",
        "192",
        "--draft-model",
        "none",
        "--kv-cache-dtype",
        "float32",
        "--chunked-prefill-size",
        "64",
        "--strict",
    ]
    with (
        run_memd(default_model, *args) as memd,
        run_modeld(memd, "--target-model", str(default_model)) as modeld,
    ):
        with client.Client(modeld.address, timeout=600) as c:
            with concurrent.futures.ThreadPoolExecutor(6) as pool:
                results = list(
                    pool.map(
                        lambda ids: c.generate(input_ids=ids, max_new_tokens=MAX_NEW, temperature=0, ignore_eos=True),
                        chat_ids[:6],
                    )
                )
        for ids, result in zip(chat_ids, results):
            expected = hf_greedy(ids, MAX_NEW, ignore_eos=True)
            assert list(result.output_ids) == expected
        log = modeld.log_path.read_text()
        assert int(re.findall(r"preemptions=(\d+)", log)[-1]) > 0, "the pool was never short: the test proves nothing"


def test_modeld_prefills_no_more_than_memd_sized_for(default_model, chat_ids, hf_greedy):
    """memd's request cap holds one prefill chunk of memd's size; modeld prefills in chunks of that size."""
    args = [
        "--max-running-requests",
        "2",
        "--max-total-tokens",
        "2048",
        "--chunked-prefill-size",
        "16",
        "--draft-model",
        "none",
        "--kv-cache-dtype",
        "float32",
        "--strict",
    ]
    with (
        run_memd(default_model, *args) as memd,
        run_modeld(memd, "--target-model", str(default_model)) as modeld,
    ):
        with client.Client(modeld.address, timeout=300) as c:
            result = c.generate(input_ids=chat_ids[0], max_new_tokens=8, temperature=0)
        assert "prefill chunk 16 tokens" in modeld.log_path.read_text()
    assert list(result.output_ids) == hf_greedy(chat_ids[0], 8)
