"""The draft the project ships for its default target (modeld/default_draft, trained with
the training pipeline, now train/): it loads through modeld's loader, greedy output with it equals plain decoding on
the CPU in fp32, and it is accepted clearly more often than a random draft (about 1.0 token per step)."""

import client
from tests.daemons import run_memd, run_modeld, shipped_draft_flags, shipped_draft_memd_args

MAX_NEW = 48


def generate_all(address: str, prompts: list[list[int]]) -> tuple[list[list[int]], int]:
    with client.Client(address, timeout=600) as c:
        results = [c.generate(input_ids=ids, max_new_tokens=MAX_NEW, temperature=0, ignore_eos=True) for ids in prompts]
    return [list(r.output_ids) for r in results], sum(r.spec_verify_ct for r in results)


def test_shipped_draft_is_lossless_and_accepted(default_model, chat_ids):
    prompts = chat_ids[:3]
    with run_memd(default_model, *shipped_draft_memd_args(1_000_000_000, 4, 512)) as memd:
        # every step verifies (the speculation policy off): tokens over verify steps is then the draft's accept length
        dflash = ["--target-model", str(default_model), *shipped_draft_flags()]
        with run_modeld(memd, *dflash, tuning="adaptive_speculation=false") as m:
            with_draft, verifies = generate_all(m.address, prompts)
        with run_modeld(memd, "--target-model", str(default_model), "--speculative-algorithm", "none") as m:
            plain, _ = generate_all(m.address, prompts)
    assert with_draft == plain
    accept_length = sum(map(len, with_draft)) / verifies
    assert accept_length > 1.2, f"accept length {accept_length:.2f}: the shipped draft is hardly accepted"
