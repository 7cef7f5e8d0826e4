"""The target's taps over packed context rows (train.target_taps) equal the model's own hidden states of each sequence
run alone, for a Qwen3 and a Llama target, taps at the last layer included; and the tiles the target's BlockMask
lists cover every pair its mask allows."""

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tests.tiny_models import load_hf, write_random_target
from train.block_layout import CONTEXT, TILE, DeviceLayout, build_layout, context_tiles
from train.packed_attention import dense
from train.target_taps import check_supported, tapped_states


def tiny_llama():
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
    )
    return LlamaForCausalLM(config).float().eval().requires_grad_(False)


@pytest.fixture(scope="module", params=["qwen3", "llama"])
def target(request, tmp_path_factory):
    if request.param == "llama":
        return tiny_llama()
    return load_hf(write_random_target(tmp_path_factory.mktemp("target") / "t", vocab=64)).requires_grad_(False)


def test_packed_taps_equal_each_sequence_run_alone(target):
    rng = np.random.default_rng(0)
    lengths = [37, 5, 130, 61]
    seqs = [rng.integers(0, 64, size=n) for n in lengths]
    layout = build_layout(lengths, [np.array([1])] * len(lengths), block=4, pad_context=300)
    device_layout = DeviceLayout(layout, torch.from_numpy, causal=False)
    ids = torch.zeros(layout.context_rows, dtype=torch.long)
    ids[: sum(lengths)] = torch.from_numpy(np.concatenate(seqs))
    last = target.config.num_hidden_layers - 1
    layer_ids = (0, 1, last)
    check_supported(target)
    with torch.no_grad():
        got = tapped_states(target, ids, device_layout.context_pos, device_layout.mask_mod(CONTEXT), dense, layer_ids)
        for seq, start in zip(seqs, layout.starts):
            states = target.model(torch.from_numpy(seq)[None], output_hidden_states=True).hidden_states
            want = torch.cat([states[i + 1][0] for i in layer_ids], dim=-1)  # the last one after the final norm
            torch.testing.assert_close(got[start : start + len(seq)], want, rtol=1e-4, atol=1e-4)
    assert torch.isfinite(got).all()  # the padding rows too: each sees at least itself


def test_a_target_of_another_family_is_refused():
    class NotLlama(torch.nn.Module):
        model = torch.nn.Module()

    with pytest.raises(ValueError, match="Llama-family decoder layers"):
        check_supported(NotLlama())


def test_the_context_tiles_cover_every_visible_pair():
    lengths = [300, 17, 129, 1, 640]
    layout = build_layout(lengths, [np.array([0])] * len(lengths), block=16, pad_context=1500)
    device_layout = DeviceLayout(layout, torch.from_numpy, causal=False)
    rows = torch.arange(layout.context_rows)
    dense_mask = device_layout.mask_mod(CONTEXT)(0, 0, rows[:, None], rows[None, :])
    counts, indices = context_tiles(layout)
    tiles = layout.context_rows // TILE
    listed = torch.zeros(tiles, tiles, dtype=torch.bool)
    for t, (n, row) in enumerate(zip(counts, indices)):
        listed[t, torch.from_numpy(row[:n].astype(np.int64))] = True
    needed = dense_mask.view(tiles, TILE, tiles, TILE).any(3).any(1)
    assert torch.equal(listed, needed)  # exactly the tiles holding a visible pair
    assert torch.equal(device_layout.block_mask(CONTEXT).to_dense()[0, 0].bool(), listed)
    assert dense_mask.sum(1).min() >= 1
