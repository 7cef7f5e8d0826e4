"""modeld's DFLASH metrics move as a speculative request runs (CPU, the shipped draft): drafts = the request's verify
steps, draft tokens = (block - 1) per draft, accepted tokens within what was generated, one accept-length observation
equal to the request's accept length (its verified tokens over its verify steps), and accepted drafts per position
(block - 1 positions, never more at a later position, summing to the accepted tokens), and the speculation policy's
block per step and accept estimate."""

import pytest

import client
from tests.daemons import run_memd, run_modeld, shipped_draft_flags, shipped_draft_memd_args
from tests.gateway.test_metrics_scrape import settled, total

BLOCK = 8
NAMES = [
    "modeld:spec_decode_num_drafts_total",
    "modeld:spec_decode_num_draft_tokens_total",
    "modeld:spec_decode_num_accepted_tokens_total",
    "modeld:spec_decode_accept_length_count",
    "modeld:spec_decode_accept_length_sum",
    "modeld:spec_decode_block_chosen_count",
    "modeld:spec_decode_block_chosen_sum",
]


def test_dflash_counters_follow_a_request(default_model, chat_ids):
    with (
        run_memd(default_model, *shipped_draft_memd_args(400_000_000, 2, 256)) as memd,
        run_modeld(
            memd, "--target-model", str(default_model), *shipped_draft_flags(BLOCK), "--metrics-port", "0"
        ) as modeld,
    ):
        before = {name: total(settled(modeld.log_path.read_text()), name) for name in NAMES}
        with client.Client(modeld.address, timeout=300) as c:
            result = c.generate(input_ids=chat_ids[0], max_new_tokens=24, temperature=0, ignore_eos=True)
            samples = settled(modeld.log_path.read_text())
    after = {name: total(samples, name) for name in NAMES}
    per_position = [
        total(samples, "modeld:spec_decode_num_accepted_tokens_per_pos_total", position=str(k))
        for k in range(BLOCK - 1)
    ]
    positions = {
        dict(labels)["position"]
        for (name, labels) in samples
        if name == "modeld:spec_decode_num_accepted_tokens_per_pos_total"
    }
    moved = {name: after[name] - before[name] for name in NAMES}
    verifies, generated = result.spec_verify_ct, len(result.output_ids)
    assert verifies > 0
    assert moved["modeld:spec_decode_num_drafts_total"] == verifies
    assert moved["modeld:spec_decode_num_draft_tokens_total"] == verifies * (BLOCK - 1)
    assert 0 <= moved["modeld:spec_decode_num_accepted_tokens_total"] <= generated - verifies + 1
    assert moved["modeld:spec_decode_accept_length_count"] == 1
    # the request's own accept length: its plain steps' tokens (the speculation policy's choice) are not in it
    assert moved["modeld:spec_decode_accept_length_sum"] == pytest.approx(result.spec_accept_length)
    assert 1 <= result.spec_accept_length <= generated / verifies
    assert positions == {str(k) for k in range(BLOCK - 1)}
    assert per_position == sorted(per_position, reverse=True)
    assert per_position[0] <= after["modeld:spec_decode_num_drafts_total"]
    assert sum(per_position) == after["modeld:spec_decode_num_accepted_tokens_total"]
    # the speculation policy's choices: each decode-only step observes the block it verified (0: a plain step)
    verify_passes, rest = divmod(moved["modeld:spec_decode_block_chosen_sum"], BLOCK)
    assert rest == 0 and 1 <= verify_passes <= verifies
    assert moved["modeld:spec_decode_block_chosen_count"] >= verify_passes
    assert 1 <= total(samples, "modeld:spec_decode_accept_estimate") <= BLOCK


def test_a_draft_counts_at_its_position_only_with_every_draft_before_it():
    from modeld.engine.metrics import accepted_per_position

    family = accepted_per_position([2, 3, 0, 1])  # block 4: verifies that accepted 0, 1, 2, 3 drafts
    assert [(s.labels["position"], s.value) for s in family.samples] == [("0", 4), ("1", 1), ("2", 1)]
