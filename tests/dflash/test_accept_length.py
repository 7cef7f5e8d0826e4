"""The accept length a request reports counts the steps that verified a DFLASH block only (CPU, the shipped
draft). With speculation off while two requests run (--speculative-disable-by-batch-size 2), the longer of two
requests decodes plainly beside the shorter one and verifies blocks once alone: its plain steps' tokens are not
in its accept length, where completion tokens / verify steps (SGLang's formula, which counted them) would inflate
it. Alone, a request verifies at every step and the two agree."""

import concurrent.futures

import pytest

import client
from memd.defaults import default_draft_dir
from tests.daemons import memd_args, run_memd, run_modeld

BLOCK, LONG = 8, 40


def test_tokens_of_plain_steps_are_not_in_the_accept_length(default_model, chat_ids):
    args = memd_args(draft=default_draft_dir(), ratio=0.25, window=256, page=64, budget=400_000_000, max_running=2,
                     chunk=256) + ["--kv-cache-dtype", "float32"]
    with run_memd(default_model, *args) as memd, \
            run_modeld(memd, "--target-model", str(default_model), "--draft-model", str(default_draft_dir()),
                       "--num-draft-tokens", str(BLOCK), "--speculative-disable-by-batch-size", "2") as modeld:
        with client.Client(modeld.address, timeout=300) as c:
            go = lambda n: c.generate(input_ids=chat_ids[0], max_new_tokens=n, temperature=0, ignore_eos=True)  # noqa: E731
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                _, beside = pool.map(go, (8, LONG))
            alone = go(LONG)
    assert beside.output_ids == alone.output_ids  # lossless either way
    assert alone.spec_verify_ct > 0 and alone.spec_accept_length == pytest.approx(LONG / alone.spec_verify_ct)
    assert beside.spec_verify_ct > 0  # it verified blocks once it ran alone
    assert 1 <= beside.spec_accept_length < LONG / beside.spec_verify_ct  # its plain steps' tokens left out
    assert beside.spec_accept_length <= BLOCK
