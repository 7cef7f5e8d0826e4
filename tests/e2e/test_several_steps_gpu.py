"""Several steps a replay (or a chain of replays with one copy of the tokens: modeld.runner.decode_chain), through the
daemons on the GPU (default model, bf16): 16 requests at once give the output of one step a replay; greedy ones
(plain, a (random) DFLASH draft verifying, and the draft's context written by plain decodes while the batch is too
large to speculate) except where bf16 rounding decides a near-tie (their batches differ over time, so their GEMMs
may too); seeded sampled ones run their whole length (the same tokens as steps one at a time are checked on the
device's own inputs in tests/modeld/runner/test_decode_chain.py: here the arrivals' batches differ from run to run, and
a sampled token, unlike a greedy one, has no near-tie rule). modeld's metrics show that steps ran several at a
time; memd's pools end free (run_memd)."""

import concurrent.futures

import pytest

import client
from tests.conftest import NEAR_TIE
from tests.daemons import memd_args, run_memd, run_modeld
from tests.gateway.test_metrics_scrape import settled, total
from tests.modeld.spec.test_dflash_gpu import first_difference_is_a_near_tie
from tests.tiny_models import write_draft

pytestmark = pytest.mark.gpu
REQUESTS, MAX_NEW = 16, 48


def generate_all(address: str, prompts: list[list[int]], sampled: bool) -> list[list[int]]:
    with client.Client(address, timeout=600) as c, concurrent.futures.ThreadPoolExecutor(REQUESTS) as pool:

        def go(i):
            sampling = dict(temperature=0.8, top_p=0.95, seed=i) if sampled else dict(temperature=0)
            return c.generate(input_ids=prompts[i], max_new_tokens=MAX_NEW, ignore_eos=True, **sampling)

        return [list(r.output_ids) for r in pool.map(go, range(len(prompts)))]


@pytest.mark.parametrize("mode", ["plain", "dflash", "sampled", "dflash-off-at-16"])
def test_several_steps_a_replay_give_the_output_of_one(tmp_path, default_model, chat_ids, hf_models, mode):
    prompts = [chat_ids[i % len(chat_ids)] + [i] for i in range(REQUESTS)]  # distinct prompts
    extra, settings = ["--speculative-algorithm", "none"], {}
    if mode.startswith("dflash"):
        draft = write_draft(
            tmp_path / "draft", default_model, layers=2, block_size=8, target_layer_ids=(1, 15, 27), sliding_window=128
        )
        below = (
            "0" if mode == "dflash" else str(REQUESTS)
        )  # dflash-off-at-16: plain decodes writing the draft's context
        extra = [
            "--speculative-algorithm",
            "dflash",
            "--draft-model",
            str(draft),
            "--speculative-disable-by-batch-size",
            below,
        ]
        settings = dict(draft=draft)
    args = memd_args(**settings, page=16, budget=2_000_000_000, max_running=REQUESTS, chunk=512) + [
        "--kv-cache-dtype",
        "bfloat16",
    ]
    outputs = {}
    with run_memd(default_model, *args, device="cuda") as memd:
        for steps in (1, 4):
            with run_modeld(
                memd,
                "--target-model",
                str(default_model),
                "--metrics-port",
                "0",
                *extra,
                device="cuda",
                name=f"modeld-{steps}",
                tuning=f"steps_per_replay={steps}",
            ) as modeld:
                outputs[steps] = generate_all(modeld.address, prompts, sampled=mode == "sampled")
                samples = settled(modeld.log_path.read_text())
                replays = total(samples, "modeld:steps_per_replay_count")
                ran = total(samples, "modeld:steps_per_replay_sum")
                assert (ran > replays) == (steps > 1), f"{ran} steps in {replays} replays at steps_per_replay={steps}"
    if mode == "sampled":
        assert all(len(a) == len(b) == MAX_NEW for a, b in zip(outputs[4], outputs[1]))
        return
    hf = hf_models("cuda")
    for prompt, a, b in zip(prompts, outputs[4], outputs[1]):
        assert len(a) == len(b) == MAX_NEW
        if a != b:
            tie, gap = first_difference_is_a_near_tie(hf, prompt, a, b)
            assert tie, f"4 steps a replay part from 1 where the top-2 logit gap is {gap:.3f} > {NEAR_TIE}"
