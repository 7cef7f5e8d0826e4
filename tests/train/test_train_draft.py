"""The draft trainer (DFlash recipe): on a tiny random target's own greedy continuations training lowers
the held-out block loss and raises the offline accept length; anchors are re-sampled every epoch; the loss
weights; a run stopped and resumed from its checkpoint takes exactly the steps an uninterrupted run takes;
the 40 MB limit; the saved draft loads with modeld's loader."""

import json
import time

import numpy as np
import pytest
import torch
from transformers import LlamaConfig

from modeld.spec.draft import load_draft
from tests.tiny_models import load_hf, write_random_target
from train.batches import epoch_batches, sample_anchors, valid_anchors, weighted
from train.block_loss import block_loss
from train.train_draft import (
    DraftTooLarge,
    TrainConfig,
    accept_length,
    build_target_layer_ids,
    check_size,
    draft_config,
    new_draft,
    paced_factor,
    save_draft,
    train,
)

TINY = dict(
    layers=1,
    block=4,
    window=16,
    taps=(1, 2),
    mask_token_id=63,
    intermediate=128,
    lr=3e-3,
    anchors=8,
    batch_anchors=128,
    batch_tokens=2048,
)


def greedy_sequences(target, count: int, seed: int) -> list[dict]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        prompt = torch.randint(0, target.config.vocab_size - 1, (1, 8), generator=gen)
        with torch.no_grad():
            ids = target.generate(
                prompt,
                max_new_tokens=32,
                do_sample=False,
                attention_mask=torch.ones_like(prompt),
                eos_token_id=None,
                pad_token_id=0,
            )[0].tolist()
        out.append({"ids": np.array(ids), "spans": [(8, len(ids))]})
    return out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("target")
    target = load_hf(write_random_target(folder / "t", vocab=64)).requires_grad_(False)
    return target, greedy_sequences(target, 24, 1), greedy_sequences(target, 8, 2)


def test_taps_follow_the_reference_rule():
    assert build_target_layer_ids(30, 5) == [1, 8, 14, 20, 27]  # SmolLM2-135M
    assert build_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]  # Qwen3-8B's public draft
    assert build_target_layer_ids(24, 5) == [1, 6, 11, 16, 21]


def test_epoch_batches_cover_every_sequence_once_in_batches_of_like_lengths():
    rng = np.random.default_rng(3)
    seqs = [{"ids": np.arange(n, dtype=np.int32), "spans": [(4, n)]} for n in rng.integers(6, 400, size=600)]
    seqs.append({"ids": np.zeros(5, dtype=np.int32), "spans": [(5, 5)]})  # no anchor: never in a batch
    tc = TrainConfig(anchors=8, batch_anchors=64, max_len=2048)
    first = epoch_batches(seqs, tc, 0)
    assert sorted(i for b in first for i in b) == list(range(600))
    assert all(sum(min(8, len(seqs[i]["ids"]) - 5) for i in b) <= 64 for b in first)
    assert first == epoch_batches(seqs, tc, 0) and first != epoch_batches(seqs, tc, 1)
    padded = sum(len(b) * max(len(seqs[i]["ids"]) for i in b) for b in first)
    assert padded < 1.1 * sum(len(s["ids"]) for s in seqs[:600])  # a random packing pads about 1.8x
    longest = [max(len(seqs[i]["ids"]) for i in b) for b in first]
    assert longest != sorted(longest)  # shuffled: not short to long


def test_training_learns_and_saves_a_loadable_draft(tiny, tmp_path):
    target, train_set, held = tiny
    tc = TrainConfig(**TINY, epochs=60)
    anchors = [sample_anchors(s, 8, tc.max_len, 5, 0, i) for i, s in enumerate(held)]
    untrained = new_draft(draft_config(target.config, tc), target.config, "cpu")
    with torch.no_grad():
        before, guesses_before, w = block_loss(untrained, target, held, anchors, tc, "cpu")
    draft, config, state = train(target, train_set, tc, "cpu", log=lambda m: None, out=tmp_path / "draft")
    assert state.step == sum(len(epoch_batches(train_set, tc, e)) for e in range(60))
    with torch.no_grad():
        after, guesses_after, _ = block_loss(draft, target, held, anchors, tc, "cpu")
    assert after < 0.5 * before, (float(before), float(after))
    assert np.mean(state.losses[-10:]) < 0.5 * np.mean(state.losses[:10])
    assert accept_length(guesses_after, held, anchors, tc.block, w) > accept_length(
        guesses_before, held, anchors, tc.block, w
    )
    saved = json.loads((tmp_path / "draft" / "config.json").read_text())
    assert saved["dflash_config"] == {"block_size": 4, "target_layer_ids": [1, 2], "mask_token_id": 63, "causal": False}
    loaded = load_draft(str(tmp_path / "draft"), target.config, torch.float32, "cpu")
    for name, value in draft.state_dict().items():
        if "rotary" not in name:
            torch.testing.assert_close(loaded.state_dict()[name], value.to(torch.bfloat16).float())


def test_anchors_are_resampled_every_epoch_and_stay_in_the_answer():
    seq = {"ids": np.arange(300), "spans": [(20, 120), (150, 290)]}
    valid = set(valid_anchors(300, seq["spans"], 2048).tolist())
    assert valid == set(range(20, 119)) | set(range(150, 289))  # a and a + 1 in one answer
    epochs = [sample_anchors(seq, 64, 2048, 0, e, 7) for e in range(3)]
    assert all(len(a) == 64 == len(set(a.tolist())) and set(a.tolist()) <= valid for a in epochs)
    assert len({tuple(a.tolist()) for a in epochs}) == 3  # a new draw each epoch
    assert sample_anchors(seq, 64, 2048, 0, 1, 7).tolist() == epochs[1].tolist()  # ... reproducible
    assert sample_anchors(seq, 64, 2048, 0, 1, 8).tolist() != epochs[1].tolist()  # ... per sequence
    assert len(sample_anchors(seq, 512, 2048, 0, 0, 7)) == len(valid)  # fewer valid positions than 512: all
    assert set(valid_anchors(300, seq["spans"], 100).tolist()) == set(range(20, 99))  # max_len cuts


def test_loss_weights_decay_and_stop_at_the_answer(tiny):
    target, train_set, _ = tiny
    tc = TrainConfig(**{**TINY, "block": 8}, gamma=7.0)
    draft = new_draft(draft_config(target.config, tc), target.config, "cpu")
    seq = dict(train_set[0], spans=[(8, 30)])
    anchors = [np.array([8, 25])]
    with torch.no_grad():
        loss, _, weights = block_loss(draft, target, [seq], anchors, tc, "cpu")
    decay = torch.exp(-torch.arange(7) / 7.0)
    torch.testing.assert_close(weights[0], decay)  # k = 1..7: exp(-(k-1)/7)
    torch.testing.assert_close(weights[1], decay * (torch.arange(26, 33) < 30))  # labels past the answer weigh 0


def test_resume_takes_the_same_steps_as_an_uninterrupted_run(tiny, tmp_path):
    target, train_set, _ = tiny
    tc = TrainConfig(**TINY, epochs=3)
    straight, _, s1 = train(target, train_set, tc, "cpu", log=lambda m: None)
    ckpt = tmp_path / "ckpt.pt"
    messages = []
    ends = []
    _, _, part = train(target, train_set, tc, "cpu", log=messages.append, ckpt=ckpt, max_steps=3, step_ends=ends)
    assert len(ends) == 3 and ends == sorted(ends)  # one end time per step taken (fit_budget's probe times them)
    assert part.step == 3 and part.epoch == 1 and "stopped at step 3" in messages[-1]  # 2 batches an epoch
    resumed, _, s2 = train(target, train_set, tc, "cpu", log=messages.append, ckpt=ckpt, resume=True)
    assert any("resumed at step 3" in m for m in messages)
    assert s2.step == s1.step == 6 and s2.losses == s1.losses
    for name, value in straight.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[name], value, rtol=0, atol=0)
    with pytest.raises(ValueError, match="other data or settings"):
        train(target, train_set[:-1], tc, "cpu", log=lambda m: None, ckpt=ckpt, resume=True)


def test_a_paced_schedule_warms_up_then_anneals_over_the_time():
    assert paced_factor(0.0, 0.04) == 0.0 and paced_factor(0.02, 0.04) == pytest.approx(0.5)
    assert paced_factor(0.04, 0.04) == 1.0 and paced_factor(0.52, 0.04) == pytest.approx(0.5)
    assert paced_factor(1.0, 0.04) == pytest.approx(0.0) and paced_factor(1.3, 0.04) == pytest.approx(0.0)


def test_a_paced_run_goes_on_past_its_epochs_and_ends_annealed_on_time(tiny, tmp_path):
    target, train_set, _ = tiny
    tc = TrainConfig(**TINY, epochs=1)
    lines: list[str] = []
    begin = time.monotonic()
    _, _, state = train(
        target, train_set, tc, "cpu", lines.append, out=tmp_path / "draft", time_budget=3.0, save_every=0, paced=True
    )
    took = time.monotonic() - begin
    assert state.epoch >= 1 and state.step > len(epoch_batches(train_set, tc, 0))  # more than its one planned epoch
    assert 3.0 <= took < 6.0 and lines[-1].startswith("done:")  # on time, not stopped mid-schedule
    lrs = [float(line.split(" lr ")[1].split()[0]) for line in lines if " lr " in line]
    assert max(lrs) > 0.9 * tc.lr and lrs[-1] < 0.05 * tc.lr  # warmed up, then annealed by the end
    assert (tmp_path / "draft" / "model.safetensors").exists()


def test_a_paced_schedule_spans_calls_through_the_checkpoint(tiny, tmp_path):
    """Two calls of one paced run: the first trains its share of a 4-second schedule and stops mid-schedule with a
    checkpoint; the second, resumed, goes on from its clock, steps and data position and ends annealed."""
    target, train_set, _ = tiny
    tc = TrainConfig(**TINY, epochs=1)
    first: list[str] = []
    _, _, one = train(
        target,
        train_set,
        tc,
        "cpu",
        first.append,
        tmp_path / "ckpt.pt",
        time_budget=2.0,
        save_every=0,
        paced=True,
        schedule_seconds=4.0,
    )
    lrs = [float(line.split(" lr ")[1].split()[0]) for line in first if " lr " in line]
    assert 2.0 <= one.seconds < 3.0 and lrs[-1] > 0.3 * tc.lr  # stopped on its own budget, the schedule half done
    second: list[str] = []
    begin = time.monotonic()
    _, _, two = train(
        target,
        train_set,
        tc,
        "cpu",
        second.append,
        tmp_path / "ckpt.pt",
        resume=True,
        time_budget=10.0,
        save_every=0,
        paced=True,
        schedule_seconds=4.0,
    )
    assert any(line.startswith(f"resumed at step {one.step}") for line in second)
    assert time.monotonic() - begin < 4.0 and 4.0 <= two.seconds < 5.0  # the schedule's 4 s, not this call's 10
    assert two.step > one.step and two.losses[: one.step] == one.losses
    lrs = [float(line.split(" lr ")[1].split()[0]) for line in second if " lr " in line]
    assert lrs[-1] < 0.05 * tc.lr and second[-1].startswith("done:")
    last: list[str] = []  # a third call with schedule_seconds 0: it ends the schedule with its own budget
    _, _, three = train(
        target,
        train_set,
        tc,
        "cpu",
        last.append,
        tmp_path / "ckpt.pt",
        resume=True,
        time_budget=1.0,
        save_every=0,
        paced=True,
        schedule_seconds=0,
    )
    assert two.seconds + 1.0 <= three.seconds < two.seconds + 2.0 and three.step > two.step
    lrs = [float(line.split(" lr ")[1].split()[0]) for line in last if " lr " in line]
    assert lrs[-1] < 0.05 * tc.lr and last[-1].startswith("done:")


def test_schedule_seconds_needs_a_paced_run():
    from train.train_draft import main

    with pytest.raises(SystemExit):
        main(["--prompts", "p", "--responses", "r", "--out", "o", "--ckpt", "c", "--schedule-seconds", "60"])


def test_source_weights_repeat_a_sources_answers_in_every_epoch(tiny):
    assert TrainConfig(source_weights="sharegpt=3,self-instruct=2").weights() == {"sharegpt": 3, "self-instruct": 2}
    assert TrainConfig().weights() == {}
    for bad in ("sharegpt", "sharegpt=0", "=2", "sharegpt=two"):
        with pytest.raises(ValueError, match="name=N"):
            TrainConfig(source_weights=bad)
    seqs = [{"ids": np.arange(30), "spans": [(4, 30)], "source": name} for name in ("sharegpt", "wordnet", None)]
    assert [s["source"] for s in weighted(seqs, {"sharegpt": 3})] == ["sharegpt"] * 3 + ["wordnet", None]
    target, train_set, _ = tiny
    tagged = [dict(s, source="sharegpt" if i < 4 else "wordnet") for i, s in enumerate(train_set)]
    lines: list[str] = []
    tc = TrainConfig(**TINY, epochs=1, source_weights="sharegpt=3")
    _, _, state = train(target, tagged, tc, "cpu", lines.append, max_steps=1, save_every=0)
    assert any(f"; {len(train_set) + 8} sequences" in line for line in lines)  # 4 answers twice more
    plan = epoch_batches(weighted(tagged, tc.weights()), tc, 0)
    assert sorted(i for b in plan for i in b) == list(range(len(train_set) + 8))  # each copy anchored in the epoch


def test_init_starts_from_a_saved_drafts_weights(tiny, tmp_path):
    target, train_set, _ = tiny
    tc = TrainConfig(**TINY, epochs=2)
    trained, _, _ = train(target, train_set, tc, "cpu", log=lambda m: None, out=tmp_path / "draft", max_steps=3)
    messages = []
    started, _, state = train(target, train_set, tc, "cpu", log=messages.append, max_steps=0, init=tmp_path / "draft")
    assert state.step == 0 and any("weights from" in m for m in messages)
    for name, value in trained.state_dict().items():  # what was saved, in bf16, is where the new run starts
        torch.testing.assert_close(started.state_dict()[name], value.to(torch.bfloat16).float(), rtol=0, atol=0)
    with pytest.raises(ValueError, match="other settings"):
        train(
            target, train_set, TrainConfig(**{**TINY, "window": 32}), "cpu", log=lambda m: None, init=tmp_path / "draft"
        )


SMOLLM2 = LlamaConfig(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    rms_norm_eps=1e-5,
    max_position_embeddings=8192,
    rope_theta=100000.0,
)


def test_the_40mb_limit():
    config = draft_config(SMOLLM2, TrainConfig())
    assert config["num_hidden_layers"] == 5 and config["dflash_config"]["target_layer_ids"] == [1, 8, 14, 20, 27]
    assert config["intermediate_size"] == 1536 and config["sliding_window"] == 256 and config["block_size"] == 16
    size = check_size(config, 576, 40.0)
    draft = new_draft(config, SMOLLM2, "cpu")
    assert size == 2 * sum(p.numel() for p in draft.parameters()) == 38_722_304  # what the check counts is the draft
    with pytest.raises(DraftTooLarge, match="over the 40 MB limit"):
        check_size(draft_config(SMOLLM2, TrainConfig(layers=6)), 576, 40.0)
    with pytest.raises(DraftTooLarge):
        check_size(draft_config(SMOLLM2, TrainConfig(intermediate=2048)), 576, 40.0)


def test_save_refuses_a_file_over_the_limit(tiny, tmp_path):
    target, _, _ = tiny
    tc = TrainConfig(**TINY)
    config = draft_config(target.config, tc)
    draft = new_draft(config, target.config, "cpu")
    assert save_draft(draft, config, tmp_path / "ok", max_mb=40.0) < 1e6
    with pytest.raises(DraftTooLarge):
        save_draft(draft, config, tmp_path / "big", max_mb=0.01)
    assert not (tmp_path / "big" / "model.safetensors").exists()


def test_the_shipped_draft_is_a_4_layer_run_of_this_trainer(default_model):
    """`--layers 4 --init modeld/default_draft` continues the shipped draft: its settings are this trainer's."""
    from transformers import AutoConfig

    from memd.defaults import default_draft_dir

    shipped = json.loads((default_draft_dir() / "config.json").read_text())
    assert draft_config(AutoConfig.from_pretrained(default_model), TrainConfig(layers=4)) == shipped


def test_profile_steps_reports_where_a_step_goes(tiny):
    from train.fit_budget import profile_steps

    target, train_set, _ = tiny
    messages = []
    table = profile_steps(target, train_set, TrainConfig(**TINY, epochs=4), "cpu", 2, messages.append)
    assert "aten::" in table and "Self CPU" in table
    assert messages and messages[0].startswith("profile of 2 steps") and "s wall" in messages[0]
    assert "host ms a step by phase: host_batch" in messages[0] and "optimizer" in messages[0]
