"""The draft the project ships for its default target (modeld/default_draft, trained with
the training pipeline, now train/): it loads through modeld's loader, greedy output with it equals plain decoding on
the CPU in fp32, and it is accepted clearly more often than a random draft (about 1.0 token per step)."""

import client
from memd.defaults import default_draft_dir
from tests.daemons import memd_args, run_memd, run_modeld

MAX_NEW = 48


def generate_all(address: str, prompts: list[list[int]]) -> tuple[list[list[int]], int]:
    with client.Client(address, timeout=600) as c:
        results = [c.generate(input_ids=ids, max_new_tokens=MAX_NEW, temperature=0, ignore_eos=True) for ids in prompts]
    return [list(r.output_ids) for r in results], sum(r.spec_verify_ct for r in results)


def test_shipped_draft_is_lossless_and_accepted(default_model, chat_ids):
    prompts = chat_ids[:3]
    args = memd_args(draft=default_draft_dir(), ratio=0.25, window=256, page=64, budget=1_000_000_000,
                     max_running=4, chunk=512) + ["--kv-cache-dtype", "float32"]
    with run_memd(default_model, *args) as memd:
        with run_modeld(memd, "--target-model", str(default_model), "--draft-model", str(default_draft_dir())) as m:
            with_draft, verifies = generate_all(m.address, prompts)
        with run_modeld(memd, "--target-model", str(default_model), "--speculative-algorithm", "none") as m:
            plain, _ = generate_all(m.address, prompts)
    assert with_draft == plain
    accept_length = sum(map(len, with_draft)) / verifies
    assert accept_length > 1.2, f"accept length {accept_length:.2f}: the shipped draft is hardly accepted"
