"""The accept length a request reports counts the steps that verified a DFLASH block only (CPU, the shipped
draft). With speculation off while two requests run (--speculative-disable-by-batch-size 2), the longer of two
requests decodes plainly beside the shorter one and verifies blocks once alone (the speculation policy off: below
the cap every step verifies): its plain steps' tokens are not
in its accept length, where completion tokens / verify steps (SGLang's formula, which counted them) would inflate
it. Alone, a request verifies at every step and the two agree."""

import concurrent.futures

import pytest

import client
from tests.daemons import run_memd, run_modeld, shipped_draft_flags, shipped_draft_memd_args

BLOCK, LONG = 8, 40


def test_tokens_of_plain_steps_are_not_in_the_accept_length(default_model, chat_ids):
    with (
        run_memd(default_model, *shipped_draft_memd_args(400_000_000, 2, 256)) as memd,
        run_modeld(
            memd,
            "--target-model",
            str(default_model),
            *shipped_draft_flags(BLOCK),
            "--speculative-disable-by-batch-size",
            "2",
            tuning="adaptive_speculation=false",  # below the cap, every step verifies: the counts are exact
        ) as modeld,
    ):
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
