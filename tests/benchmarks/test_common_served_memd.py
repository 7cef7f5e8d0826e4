"""bench.common.served_memd: a row's memd keeps memd's defaults for the row's kind, so that modeld, which reads its
decode lookahead and prefill chunk from memd's layout, runs as served."""

import pytest

from bench.common.served_memd import MemdSettings, memd_flags
from memd import defaults
from memd.config import MemdConfig, config_from_args

SETTINGS = MemdSettings(target="target", draft="draft", max_running=64)


@pytest.mark.parametrize("kind", ["plain", "dflash"])
def test_memd_for_a_kind_has_that_kinds_lookahead_and_prefill_chunk(kind):
    cfg = config_from_args([*memd_flags(kind, SETTINGS), "--listen", "unix:///nowhere/memd.sock"])
    assert cfg.decode_lookahead == defaults.default_decode_lookahead(draft=kind == "dflash")
    assert cfg.chunked_prefill_size == MemdConfig.chunked_prefill_size
    assert cfg.max_running_requests == 64 and cfg.page_size == 16


def test_only_dflash_rows_get_a_draft_pool():
    plain = config_from_args([*memd_flags("plain", SETTINGS), "--listen", "unix:///nowhere/memd.sock"])
    dflash = config_from_args([*memd_flags("dflash", SETTINGS), "--listen", "unix:///nowhere/memd.sock"])
    assert plain.draft_model is None
    assert (dflash.draft_model, dflash.draft_kv_ratio, dflash.draft_window) == ("draft", 0.25, 256)
