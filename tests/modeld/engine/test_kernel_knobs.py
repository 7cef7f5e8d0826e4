"""modeld's kernel knobs reach what they switch: MODELD_TUNING's skinny_linear and norm_fusion set the target's
projections and decoder layers, and the DFLASH draft's serving layers, to the unfused path (the default: both on).
Through a real memd and the default model on the CPU, where the switches are kept though the kernels run on a GPU
only. memd ends idle."""

import pytest

from modeld.config import config_from_args
from modeld.engine.build import build_engine
from modeld.model.causal_lm import DecoderLayer, RowLinear
from tests.daemons import is_idle, memd_args, run_memd


def switches(built) -> tuple[set, set, tuple]:
    """The skinny switch of every target projection, the fusion switch of every decoder layer, the draft's pair."""
    model = built.engine.runner.model
    draft = built.engine.runner.spec.draft
    return (
        {m.skinny for m in model.modules() if isinstance(m, RowLinear)},
        {m.fuse_norms for m in model.modules() if isinstance(m, DecoderLayer)},
        (draft.skinny, draft.fuse_norms),
    )


@pytest.mark.parametrize(
    "tuning,expected",
    [
        ("", ({True}, {True}, (True, True))),
        ("norm_fusion=false", ({True}, {False}, (True, False))),
        ("skinny_linear=false", ({False}, {True}, (False, True))),
    ],
)
def test_the_knobs_reach_the_target_and_the_draft(default_model, tmp_path, monkeypatch, tuning, expected):
    from tests.tiny_models import write_draft

    draft = write_draft(
        tmp_path / "draft", default_model, layers=1, block_size=4, target_layer_ids=(1, 15), sliding_window=64
    )
    with run_memd(
        default_model, *memd_args(max_running=2, budget=20_000_000, chunk=256, draft=draft, window=64)
    ) as memd:
        args = [
            "--memd",
            memd.address,
            "--target-model",
            str(default_model),
            "--draft-model",
            str(draft),
            "--speculative-algorithm",
            "dflash",
            "--device",
            "cpu",
        ]
        monkeypatch.setenv("MODELD_TUNING", tuning)
        built = build_engine(config_from_args(args), lambda serving: None)
        try:
            assert switches(built) == expected
        finally:
            built.link.close()
        assert is_idle(memd.wait_idle(10))
