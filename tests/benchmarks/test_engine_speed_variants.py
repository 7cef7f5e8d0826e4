"""bench.engine_speed's variants are valid modeld settings (the benchmark itself needs a GPU: a variant that modeld's
config refuses would fail there only, after the machine's set-up)."""

import argparse

import pytest

from bench.engine_variants import SERVED, VARIANTS, variant_config
from modeld.config import ModeldConfig

ARGS = argparse.Namespace(target="target", load_format="dummy", draft="draft")


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_every_variant_makes_a_modeld_config(variant):
    cfg = variant_config(variant, "unix:///nowhere", ARGS)
    assert cfg.speculative_algorithm == ("dflash" if variant.dflash else "none")
    assert cfg.tuning.steps_per_replay == variant.steps


def test_the_served_variants_have_modelds_defaults():
    """The rows named as served run what modeld runs by default on CUDA (the fields a variant sets)."""
    served = {v.name: v for v in VARIANTS}
    for kind, name in SERVED.items():
        cfg = variant_config(served[name], "unix:///nowhere", ARGS)
        default = ModeldConfig(
            device="cuda",
            memd="unix:///nowhere",
            target_model="target",
            draft_model="draft" if kind == "dflash" else None,
            speculative_algorithm=kind if kind == "dflash" else "none",
        )
        fields = ["disable_cuda_graph"] + (["speculative_disable_by_batch_size"] if kind == "dflash" else [])
        for field in fields:
            assert getattr(cfg, field) == getattr(default, field), (kind, field)
        assert cfg.tuning.overlaps_decode("cuda") == default.tuning.overlaps_decode("cuda"), kind
        assert cfg.tuning.steps_per_replay == default.tuning.steps_per_replay, kind
        if kind == "dflash":
            assert cfg.tuning.speculate_below_sampled == default.tuning.speculate_below_sampled
