"""The draft trainer: on a tiny random target's own greedy continuations, training lowers the held-out
block loss and raises the offline accept length above an untrained draft's; the saved draft is a
z-lab format folder that modeld's loader reads back."""

import json
import random

import torch

from modeld.draft import load_draft
from modeld.train_draft import TrainConfig, accept_length, block_loss, draft_config, new_draft, pick_anchors, save_draft, train
from tests.dflash.tiny_models import load_hf, write_random_target


def greedy_sequences(target, count: int, seed: int) -> list[dict]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        prompt = torch.randint(0, target.config.vocab_size - 1, (1, 8), generator=gen)
        with torch.no_grad():
            ids = target.generate(prompt, max_new_tokens=32, do_sample=False, attention_mask=torch.ones_like(prompt),
                                  eos_token_id=None, pad_token_id=0)[0].tolist()
        out.append({"ids": ids, "response_start": 8})
    return out


def test_training_learns_and_saves_a_loadable_draft(tmp_path):
    target = load_hf(write_random_target(tmp_path / "t", vocab=64)).requires_grad_(False)
    train_set, held = greedy_sequences(target, 24, 1), greedy_sequences(target, 8, 2)
    tc = TrainConfig(layers=1, block=4, window=16, taps=(1, 2), mask_token_id=63, intermediate=128, steps=150,
                     batch=16, anchors=8, lr=3e-3)
    anchors = pick_anchors(held, 8, tc.block, random.Random(5))
    untrained = new_draft(draft_config(target.config, tc), target.config, "cpu")
    with torch.no_grad():
        before, guesses_before = block_loss(untrained, target, held, anchors, tc, "cpu")
    draft, config, losses = train(target, train_set, tc, "cpu", log=lambda message: None)
    with torch.no_grad():
        after, guesses_after = block_loss(draft, target, held, anchors, tc, "cpu")
    assert after < 0.5 * before, (float(before), float(after))
    assert accept_length(guesses_after, held, anchors, tc.block) > accept_length(guesses_before, held, anchors, tc.block)
    save_draft(draft, config, tmp_path / "draft")
    saved = json.loads((tmp_path / "draft" / "config.json").read_text())
    assert saved["dflash_config"] == {"block_size": 4, "target_layer_ids": [1, 2], "mask_token_id": 63, "causal": False}
    loaded = load_draft(str(tmp_path / "draft"), target.config, torch.float32, "cpu")
    for name, value in draft.state_dict().items():
        if "rotary" not in name:
            torch.testing.assert_close(loaded.state_dict()[name], value.to(torch.bfloat16).float())


def test_max_seconds_stops_after_the_first_step(tmp_path):
    target = load_hf(write_random_target(tmp_path / "t", vocab=64)).requires_grad_(False)
    tc = TrainConfig(layers=1, block=4, window=16, taps=(1, 2), mask_token_id=63, intermediate=128, steps=150,
                     batch=4, anchors=4, lr=3e-3, max_seconds=0)
    messages = []
    draft, config, losses = train(target, greedy_sequences(target, 4, 1), tc, "cpu", log=messages.append)
    assert len(losses) == 1 and losses[0] > 0
    assert "stopped at step 0 of 150" in messages[-1]
    save_draft(draft, config, tmp_path / "draft")
    loaded = load_draft(str(tmp_path / "draft"), target.config, torch.float32, "cpu")
    for name, value in draft.state_dict().items():
        if "rotary" not in name:
            torch.testing.assert_close(loaded.state_dict()[name], value.to(torch.bfloat16).float())
