"""A draft with --load-format dummy: seeded random weights from config.json alone, checked against the target like
a real one (the benchmarks' 8B-shaped draft has no weights on disk)."""

import pathlib

import pytest
import torch
from transformers import AutoConfig

from modeld.spec.draft import DraftError, load_draft

CONFIGS = pathlib.Path(__file__).resolve().parents[3] / "bench" / "configs"
DRAFT = pathlib.Path(__file__).resolve().parents[3] / "modeld" / "default_draft"


def test_dummy_draft_loads_from_config_alone_and_is_seeded(tmp_path):
    (tmp_path / "config.json").write_text((DRAFT / "config.json").read_text())  # no weights beside it
    target = AutoConfig.from_pretrained(CONFIGS / "smollm2-135m")
    a = load_draft(str(tmp_path), target, torch.float32, "cpu", dummy=True)
    b = load_draft(str(tmp_path), target, torch.float32, "cpu", dummy=True)
    for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.isfinite(p).all() and torch.equal(p, q), name
    assert a.spec.block_size == 16 and a.spec.windows == (256,) * 4


def test_dummy_draft_must_still_fit_the_target():
    target = AutoConfig.from_pretrained(CONFIGS / "smollm2-135m")
    with pytest.raises(DraftError, match="hidden_size"):
        load_draft(str(CONFIGS / "llama3-8b-draft"), target, torch.float32, "cpu", dummy=True)
