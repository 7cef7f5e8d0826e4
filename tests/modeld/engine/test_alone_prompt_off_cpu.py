"""The alone_prompt_tokens knob needs CUDA graphs: on the CPU the engine keeps every prompt chunk beside the decodes,
and says so when the knob asked for it; by default it is off there without a word (through a real memd and the default
model)."""

import logging

import pytest

from modeld.config import ModeldConfig
from modeld.engine.build import build_engine
from modeld.engine.tuning import Tuning
from tests.daemons import memd_args, run_memd


@pytest.mark.parametrize("asked", [128, None], ids=["asked-for", "default"])
def test_alone_prompt_tokens_without_graphs_is_off(default_model, caplog, asked):
    with run_memd(default_model, *memd_args(max_running=2, budget=20_000_000, chunk=256)) as memd:
        with caplog.at_level(logging.WARNING, logger="modeld"):
            built = build_engine(
                ModeldConfig(
                    memd=memd.address, target_model=str(default_model), tuning=Tuning(alone_prompt_tokens=asked)
                ),
                lambda serving: None,
            )
        try:
            assert built.engine.scheduler.alone_prompt_tokens == 0
            said = any("alone_prompt_tokens is off" in r.getMessage() for r in caplog.records)
            assert said == (asked is not None)
        finally:
            built.link.close()
        memd.wait_all_free()
