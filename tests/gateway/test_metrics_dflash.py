"""modeld's DFLASH metrics move as a speculative request runs (CPU, the shipped draft): drafts = the request's
verify steps, draft tokens = (block - 1) per draft, accepted tokens within what was generated, one accept-length
observation equal to the request's accept length."""

import pytest

import client
from memd.defaults import default_draft_dir
from tests.daemons import memd_args, run_memd, run_modeld
from tests.gateway.test_metrics_scrape import scrape, total

BLOCK = 8
NAMES = ["modeld:spec_decode_num_drafts_total", "modeld:spec_decode_num_draft_tokens_total",
         "modeld:spec_decode_num_accepted_tokens_total", "modeld:spec_decode_accept_length_count",
         "modeld:spec_decode_accept_length_sum"]


def test_dflash_counters_follow_a_request(default_model, chat_ids):
    args = memd_args(draft=default_draft_dir(), ratio=0.25, window=256, page=64, budget=400_000_000, max_running=2,
                     chunk=256) + ["--kv-cache-dtype", "float32"]
    with run_memd(default_model, *args) as memd, \
            run_modeld(memd, "--target-model", str(default_model), "--draft-model", str(default_draft_dir()),
                       "--num-draft-tokens", str(BLOCK), "--metrics-port", "0") as modeld:
        before = {name: total(scrape(modeld.log_path.read_text()), name) for name in NAMES}
        with client.Client(modeld.address, timeout=300) as c:
            result = c.generate(input_ids=chat_ids[0], max_new_tokens=24, temperature=0, ignore_eos=True)
        after = {name: total(scrape(modeld.log_path.read_text()), name) for name in NAMES}
    moved = {name: after[name] - before[name] for name in NAMES}
    verifies, generated = result.spec_verify_ct, len(result.output_ids)
    assert verifies > 0
    assert moved["modeld:spec_decode_num_drafts_total"] == verifies
    assert moved["modeld:spec_decode_num_draft_tokens_total"] == verifies * (BLOCK - 1)
    assert 0 <= moved["modeld:spec_decode_num_accepted_tokens_total"] <= generated - verifies + 1
    assert moved["modeld:spec_decode_accept_length_count"] == 1
    assert moved["modeld:spec_decode_accept_length_sum"] == pytest.approx(generated / verifies)
