"""The engine's tuning knobs: defaults as served, overridden by MODELD_TUNING's "field=value" pairs, every bad
pair refused with a message that names the variable and the field."""

import pytest

from modeld.engine.tuning import Tuning, tuning_from_environment


def test_defaults_are_modeld_as_served():
    tuning = Tuning()
    assert tuning.steps_per_replay == 4 and tuning.skinny_linear and tuning.norm_fusion
    assert tuning.overlaps_decode("cuda") and not tuning.overlaps_decode("cpu")  # on the CPU it would not overlap
    assert tuning.alone_prompt_limit(graphed=True) == 128 and tuning.alone_prompt_limit(graphed=False) == 0


def test_overrides_parse_by_each_fields_type(monkeypatch):
    monkeypatch.setenv("MODELD_TUNING", " steps_per_replay=1, overlap_decode=True ,alone_prompt_tokens=none,")
    tuning = tuning_from_environment()
    assert (tuning.steps_per_replay, tuning.overlap_decode, tuning.alone_prompt_tokens) == (1, True, None)
    assert tuning.overlaps_decode("cpu")
    monkeypatch.delenv("MODELD_TUNING")
    assert tuning_from_environment() == Tuning()


@pytest.mark.parametrize(
    "spec,message",
    [
        ("steps_per_replay", "is not field=value"),
        ("no_such_knob=1", "is not field=value with a field of skinny_linear"),
        ("skinny_linear=2", "skinny_linear takes"),
        ("steps_per_replay=true", "steps_per_replay takes"),
        ("steps_per_replay=four", "is not a number, true, false or none"),
        ("steps_per_replay=0", "steps_per_replay must be >= 1"),
        ("alone_prompt_tokens=129", r"alone_prompt_tokens must lie in \[0, 128\]"),
        ("adaptive_speculation=1", "adaptive_speculation takes"),
    ],
)
def test_bad_overrides_are_refused(spec, message):
    with pytest.raises(ValueError, match=message) as raised:
        Tuning().overridden(spec)
    assert "MODELD_TUNING" in str(raised.value)
