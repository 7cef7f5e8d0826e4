"""bench.common.simulated_acceptance: the draw has the acceptance it is given (per position, and as a mean accept
length), padding blocks commit nothing, and an engine verifying by it on the CPU (the default model with the shipped
draft, through a real memd) commits about that many tokens a verify step, far above what the draft itself accepts
there; memd ends idle."""

import pytest
import torch

from bench.common.requests import generate_all
from bench.common.simulated_acceptance import SimulatedAcceptance, expected_length, simulate
from memd.defaults import default_draft_dir
from modeld.config import ModeldConfig
from modeld.engine.build import build_engine
from modeld.engine.tuning import Tuning
from tests.daemons import run_memd, shipped_draft_memd_args
from tests.modeld.engine.workloads import wait_until_released

BLOCK = 16


@pytest.mark.parametrize("length", [1.0, 2.0, 4.24, 6.5, 16.0])
def test_a_mean_accept_length_is_met_by_one_rate_at_every_position(length):
    acceptance = SimulatedAcceptance.with_mean(length, BLOCK)
    assert len(acceptance.rates) == BLOCK - 1 and len(set(acceptance.rates)) == 1
    assert acceptance.mean() == pytest.approx(length, abs=1e-6)


@pytest.mark.parametrize("bad", [0.5, 17.0])
def test_an_accept_length_outside_one_to_the_block_is_refused(bad):
    with pytest.raises(ValueError, match="must lie in"):
        SimulatedAcceptance.with_mean(bad, BLOCK)


def test_the_draw_follows_the_rates_position_by_position():
    torch.manual_seed(0)
    rates = [0.9, 0.5, 0.2] + [0.0] * (BLOCK - 4)
    acceptance = SimulatedAcceptance(rates)
    n = 40_000
    drafts = torch.zeros((n, BLOCK - 1), dtype=torch.int64)
    lengths = acceptance(drafts, torch.zeros((n, BLOCK), dtype=torch.int64))
    assert lengths.dtype == torch.int64 and int(lengths.min()) >= 1 and int(lengths.max()) <= 4
    reached = [(lengths > k).float().mean().item() for k in (1, 2, 3)]  # accepted position k
    assert reached == pytest.approx([0.9, 0.45, 0.09], abs=0.01)
    assert lengths.float().mean().item() == pytest.approx(expected_length(rates), abs=0.02)


def test_padding_blocks_commit_nothing_and_every_block_its_bonus():
    acceptance = SimulatedAcceptance([0.0] * (BLOCK - 1))
    drafts = torch.zeros((3, BLOCK - 1), dtype=torch.int64)
    live = torch.tensor([5, -1, 7])
    assert acceptance(drafts, torch.zeros((3, BLOCK), dtype=torch.int64), live).tolist() == [1, 0, 1]


def test_an_engine_verifying_by_it_commits_its_accept_length(default_model, chat_ids):
    torch.manual_seed(0)
    with run_memd(default_model, *shipped_draft_memd_args(1_000_000_000, 4, 512)) as memd:
        cfg = ModeldConfig(
            memd=memd.address,
            target_model=str(default_model),
            draft_model=str(default_draft_dir()),
            speculative_algorithm="dflash",
            tuning=Tuning(adaptive_speculation=False),  # every step verifies: tokens over verifies is the accept
        )
        built = build_engine(cfg, lambda serving: None)
        engine = built.engine
        simulate(engine, SimulatedAcceptance.with_mean(6.0, engine.runner.spec.block))
        engine.start()
        try:
            tokens, _, verifies = generate_all(engine, chat_ids[:3], 128, True, "simulated")
            wait_until_released(memd, engine)
        finally:
            engine.stop()
            built.link.close()
    assert tokens == 3 * 128
    # each request's first token comes from its prompt's step and its last block may be cut at 128 tokens: about 6
    assert 4.5 <= tokens / verifies <= 7.5, tokens / verifies
