"""The packed training loss (train.block_loss: every anchor's block in one draft forward under a flex-attention
block mask, the frozen head's cross-entropy in chunks) against the per-anchor reference (each anchor gathers its own
context window and runs the serving module's path): the same loss, gradients, predictions and weights for the same
batch and anchors, in fp32 on the CPU, for sliding and full attention, bidirectional and causal blocks."""

import dataclasses

import numpy as np
import pytest
import torch

from tests.tiny_models import load_hf, write_random_target
from tests.train.per_anchor_reference import per_anchor_loss
from train.block_layout import TILE, DeviceLayout, build_layout, key_tiles
from train.block_loss import FIXED_LAYOUTS, block_loss
from train.head_loss import head_cross_entropy
from train.train_draft import TrainConfig, draft_config, new_draft

TINY = dict(
    layers=2,
    block=4,
    window=16,
    taps=(1, 2),
    mask_token_id=63,
    intermediate=128,
    anchors=8,
    batch_anchors=128,
    batch_tokens=512,
    max_len=512,
)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    folder = tmp_path_factory.mktemp("target")
    return load_hf(write_random_target(folder / "t", vocab=64)).requires_grad_(False)


def batch(seed: int, count: int = 5):
    """Sequences of 20-60 tokens with one or two answer spans, and sorted anchors in them (some at the answer's
    first position, so that blocks see little context, and near the end, so that labels run past it)."""
    rng = np.random.default_rng(seed)
    seqs, anchors = [], []
    for _ in range(count):
        n = int(rng.integers(20, 60))
        start = int(rng.integers(3, 10))
        spans = [(start, n)] if rng.random() < 0.5 else [(start, n // 2), (n // 2 + 3, n)]
        seqs.append({"ids": rng.integers(0, 63, size=n).astype(np.int32), "spans": spans})
        valid = np.concatenate([np.arange(s, e - 1) for s, e in spans])
        anchors.append(np.sort(rng.choice(valid, size=min(len(valid), int(rng.integers(3, 12))), replace=False)))
    return seqs, anchors


def grads(draft) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in draft.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("window", [16, None])
@pytest.mark.parametrize("causal", [False, True])
def test_packed_loss_equals_the_per_anchor_reference(target, window, causal):
    tc = TrainConfig(**TINY)
    draft = new_draft(draft_config(target.config, tc), target.config, "cpu")
    draft.spec = dataclasses.replace(draft.spec, windows=(window,) * tc.layers, causal=causal)
    seqs, anchors = batch(1)
    want, want_guesses, want_weights = per_anchor_loss(draft, target, seqs, anchors, tc)
    want.backward()
    want_grads = grads(draft)
    draft.zero_grad(set_to_none=True)
    got, guesses, weights = block_loss(draft, target, seqs, anchors, tc, "cpu")
    got.backward()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(weights, want_weights)
    labelled = weights > 0
    assert labelled.any() and not labelled.all()  # labels past an answer weigh nothing
    assert torch.equal(guesses[labelled], want_guesses[labelled]) and (guesses[~labelled] == -1).all()
    got_grads = grads(draft)
    assert got_grads.keys() == want_grads.keys() and len(got_grads) > 10
    for name, value in want_grads.items():
        torch.testing.assert_close(got_grads[name], value, rtol=1e-4, atol=1e-6, msg=name)


def test_fixed_shapes_pad_without_changing_the_loss(target):
    """Padded to the batch budgets (the compiled step's fixed shapes, its device tables reused from step to step),
    the loss and gradients of two batches in turn stay those of the unpadded layout."""
    tc = TrainConfig(**TINY)
    draft = new_draft(draft_config(target.config, tc), target.config, "cpu")
    for seed in (2, 4):
        seqs, anchors = batch(seed)
        draft.zero_grad(set_to_none=True)
        loose, _, _ = block_loss(draft, target, seqs, anchors, tc, "cpu")
        loose.backward()
        want = grads(draft)
        draft.zero_grad(set_to_none=True)
        fixed, _, _ = block_loss(draft, target, seqs, anchors, tc, "cpu", fixed_shapes=True)
        fixed.backward()
        torch.testing.assert_close(fixed, loose, rtol=1e-6, atol=1e-6)
        for name, value in grads(draft).items():
            torch.testing.assert_close(value, want[name], rtol=1e-5, atol=1e-7)
    assert len(FIXED_LAYOUTS) == 1  # one set of device tables, updated in place


@pytest.mark.parametrize("block,window", [(16, 256), (16, None), (10, 64), (8, 256)])
def test_the_key_tiles_cover_every_visible_pair_and_little_else(block, window):
    """Every (query, key) pair the mask allows lies in a tile the BlockMask lists (flex attention skips the rest),
    and a query tile lists a few tiles, not every one."""
    rng = np.random.default_rng(block)
    lengths = rng.integers(30, 900, size=6)
    anchors = [
        np.sort(rng.choice(np.arange(1, n - 1), size=min(n - 2, int(rng.integers(5, 300))), replace=False))
        for n in lengths
    ]
    anchors[2] = np.array([0, 1, 2])  # blocks with no or little context
    layout = build_layout(lengths, anchors, block, pad_anchors=len(np.concatenate(anchors)) + 37)
    device_layout = DeviceLayout(layout, torch.from_numpy, causal=False)
    visible = device_layout.mask_mod(window)
    q = torch.arange(layout.query_rows)[:, None]
    kv = torch.arange(layout.context_rows + layout.query_rows)[None, :]
    dense = visible(0, 0, q, kv)
    counts, indices = key_tiles(layout, window)
    listed = torch.zeros(layout.query_rows // TILE, dense.shape[1] // TILE, dtype=torch.bool)
    for t, (n, row) in enumerate(zip(counts, indices)):
        listed[t, torch.from_numpy(row[:n].astype(np.int64))] = True
    needed = dense.view(len(listed), TILE, -1, TILE).any(3).any(1)
    assert not (needed & ~listed).any(), "a visible pair lies in a tile the BlockMask skips"
    assert dense.sum(1).min() >= 1  # every query row sees at least its own block
    assert torch.equal(device_layout.block_mask(window).to_dense()[0, 0].bool(), listed)  # what flex attention reads
    assert (listed & ~needed).sum() <= 0.05 * listed.sum()  # almost every listed tile holds a visible pair
    assert listed.sum() < 0.2 * listed.numel()  # a sparse mask, not a dense one
    # each anchor's row sees exactly its visible context and its block
    a = int(np.flatnonzero(layout.anchor_seq == 3)[4])
    seq, pos = 3, int(layout.anchor_pos[a])
    row = dense[a * block + 5]
    context = torch.nonzero(row[: layout.context_rows])[:, 0].numpy()
    lo = 0 if window is None else max(0, pos + 5 - window + 1)
    assert context.tolist() == list(range(layout.starts[seq] + lo, layout.starts[seq] + pos))
    assert torch.nonzero(row[layout.context_rows :])[:, 0].tolist() == list(range(a * block, a * block + block))


def test_the_head_cross_entropy_in_chunks_equals_the_full_one():
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(37, 16, generator=gen, dtype=torch.float64, requires_grad=True)
    head = torch.randn(50, 16, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 50, (37,), generator=gen)
    weights = torch.rand(37, generator=gen, dtype=torch.float64)
    want = (torch.nn.functional.cross_entropy(hidden @ head.T, labels, reduction="none") * weights).sum()
    (want_grad,) = torch.autograd.grad(want * 0.7, hidden)
    got, guesses = head_cross_entropy(hidden, head, labels, weights, chunk_rows=8)
    (got_grad,) = torch.autograd.grad(got * 0.7, hidden)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)  # logits in fp32
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-5, atol=1e-5)
    assert torch.equal(guesses, (hidden @ head.T).argmax(-1))
    with pytest.raises(ValueError, match="frozen"):
        head_cross_entropy(hidden, head.clone().requires_grad_(True), labels, weights)


@pytest.mark.gpu
def test_the_compiled_step_on_cuda_matches_the_reference(target):
    """On the GPU the packed loss runs the draft compiled whole, flex attention inside, in bf16 under autocast, at
    fixed shapes: the same loss and gradients as the fp32 per-anchor reference within bf16's error, for two batches
    in turn (the second reuses the first's compiled code and device tables with its own layout and masks)."""
    cuda_target = target.to("cuda")
    tc = TrainConfig(**TINY)
    draft = new_draft(draft_config(cuda_target.config, tc), cuda_target.config, "cuda")
    for seed in (3, 4):
        seqs, anchors = batch(seed, count=12)
        draft.zero_grad(set_to_none=True)
        want, _, _ = per_anchor_loss(draft, cuda_target, seqs, anchors, tc, "cuda")
        want.backward()
        want_grads = grads(draft)
        draft.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            got, _, _ = block_loss(draft, cuda_target, seqs, anchors, tc, "cuda", fixed_shapes=True)
        got.backward()
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
        for name, value in want_grads.items():
            err = (grads(draft)[name] - value).norm() / value.norm().clamp(min=1e-12)
            assert err < 5e-2, (seed, name, float(err))
