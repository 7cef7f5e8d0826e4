"""--alone-prompt-tokens needs CUDA graphs: on the CPU the engine says so and its scheduler keeps every prompt chunk
beside the decodes (through a real memd and the default model)."""

import logging

from modeld.config import ModeldConfig
from modeld.engine_build import build_engine
from tests.daemons import memd_args, run_memd


def test_alone_prompt_tokens_without_graphs_is_off_and_said(default_model, caplog):
    with run_memd(default_model, *memd_args(max_running=2, budget=20_000_000, chunk=256)) as memd:
        with caplog.at_level(logging.WARNING, logger="modeld"):
            built = build_engine(ModeldConfig(memd=memd.address, target_model=str(default_model),
                                              alone_prompt_tokens=128), lambda serving: None)
        try:
            assert built.engine.scheduler.alone_prompt_tokens == 0
            assert any("--alone-prompt-tokens is off" in r.getMessage() for r in caplog.records)
        finally:
            built.link.close()
