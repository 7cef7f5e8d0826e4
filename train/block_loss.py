"""The training loss of one batch of DFLASH blocks, in one draft forward over every anchor of the batch.

1. The target runs over the batch's sequences packed one after another, each attending within itself (no
   gradient, its own precision; train.target_taps), for the tapped hidden states.
2. The taps go through the draft's fc + hidden_norm and each layer's K/V projection once per position: the
   context rows of train.block_layout.
3. Every anchor's block (its token, then mask tokens) goes through the draft's layers as one set of query rows;
   each layer's attention is flex attention over the context rows and the block rows, under the layout's mask
   (what the draft sees at inference: modeld/spec/draft.py). No anchor copies its context window.
4. Block position k >= 1 predicts the token at anchor + k through the target's frozen LM head
   (train.head_loss: in chunks, no full logits), weighted exp(-(k-1)/gamma) and only where the label lies in an
   answer of the sequence.
"""

import functools
from dataclasses import dataclass

import numpy as np
import torch
from torch.profiler import record_function

from train.batches import label_mask
from train.block_layout import CONTEXT, BlockLayout, DeviceLayout, build_layout
from train.head_loss import head_cross_entropy
from train.packed_attention import dense, flex, flex_dynamic
from train.target_taps import compiled_tapped_states, tapped_states

# The device tables of the fixed-shape layouts, kept across steps (DeviceLayout.update), by device and shapes.
FIXED_LAYOUTS: dict = {}


def to_device(array: np.ndarray, device: str) -> torch.Tensor:
    """A host array on the device without waiting for the device: on CUDA through pinned memory, non-blocking (a
    pageable copy waits for the stream's earlier work, which would stop the host preparing a step while the
    device runs the last one; PyTorch's pinned-memory cache keeps the buffer until its copy is done)."""
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    if device.startswith("cuda"):
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def draft_blocks(
    draft,
    taps: torch.Tensor,
    embeds: torch.Tensor,
    context_pos: torch.Tensor,
    query_pos: torch.Tensor,
    masks: dict,
    attend,
    attention_dtype,
) -> torch.Tensor:
    """The draft's final hidden states [query rows, hidden] of every block at once. taps: the tapped target layers
    of every context row; embeds: the target's embedding of each block row; masks: each window's mask, as `attend`
    (flex, flex_dynamic or dense) takes it; attention_dtype: q, k and v's dtype in attention (None: q's)."""
    context = draft.hidden_norm(draft.fc(taps.to(draft.fc.weight.dtype)))
    h = embeds.to(context.dtype)
    cos_c, sin_c = draft.rope(context, context_pos)
    cos_q, sin_q = draft.rope(h, query_pos)
    for layer, window in zip(draft.layers, draft.spec.windows):
        attn = layer.self_attn
        x = layer.input_layernorm(h)
        q = attn.query(x, cos_q, sin_q)
        context_k, context_v = attn.kv(context, cos_c, sin_c)
        block_k, block_v = attn.kv(x, cos_q, sin_q)
        dtype = attention_dtype or q.dtype
        k = torch.cat([context_k.to(dtype), block_k.to(dtype)])
        v = torch.cat([context_v.to(dtype), block_v.to(dtype)])
        out = attend(q.to(dtype), k, v, masks[window], attn.head_dim**-0.5)
        h = h + attn.o_proj(out.flatten(-2).to(x.dtype))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return draft.norm(h)


@functools.cache
def compiled_blocks():
    """draft_blocks compiled whole for a training step's fixed shapes: its norms, rotary, casts and residual adds
    fused around the matrix products, forward and backward (run op by op they cost more device time than the
    products), and flex attention inside. Compiled once: the masks' functions and the tables they read are the same
    objects every step (DeviceLayout), and a new BlockMask of the same shapes is only new inputs."""
    return torch.compile(draft_blocks, dynamic=False)


def layout_on(device: str, layout, causal: bool, fixed_shapes: bool) -> DeviceLayout:
    """The layout's tables on the device: for fixed shapes the same tensors every step, updated in place."""
    if not fixed_shapes:
        return DeviceLayout(layout, lambda a: to_device(a, device), causal)
    key = (device, layout.block, layout.context_rows, len(layout.anchor_seq), causal)
    held = FIXED_LAYOUTS.get(key)
    if held is None:
        held = FIXED_LAYOUTS[key] = DeviceLayout(layout, lambda a: to_device(a, device), causal)
    else:
        held.update(layout)
    return held


def runners(device_layout: DeviceLayout, keys, cuda: bool, fixed_shapes: bool):
    """(each mask key's mask, the attention function that takes it, the target's forward, the draft's forward): on
    the CPU the dense masks (flex attention has no CPU backward); on CUDA BlockMasks, with both forwards compiled
    whole at a training step's fixed shapes, or flex attention compiled alone for shapes that change."""
    if not cuda:
        return {k: device_layout.mask_mod(k) for k in keys}, dense, tapped_states, draft_blocks
    masks = {k: device_layout.block_mask(k) for k in keys}
    if fixed_shapes:
        return masks, flex, compiled_tapped_states(), compiled_blocks()
    return masks, flex_dynamic, tapped_states, draft_blocks


@dataclass(frozen=True)
class HostBatch:
    """A batch's host arrays: its layout, the target's input (the context rows), and the labels of every block row
    k >= 1."""

    layout: BlockLayout
    context_ids: np.ndarray  # [context rows] the sequences' tokens one after another, padded with 0
    block_ids: np.ndarray  # [anchors, block] the anchor's token, then mask tokens
    labels: np.ndarray  # [real anchors, block - 1] the token at anchor + k
    weights: np.ndarray  # [real anchors, block - 1] exp(-(k-1)/gamma) where the label lies in an answer, else 0
    kept: np.ndarray  # the flat indices of the weighted labels (the rows the loss reads)


def host_batch(seqs: list[dict], anchors: list[np.ndarray], tc, fixed_shapes: bool) -> HostBatch:
    block = tc.block
    lengths = np.array([min(len(s["ids"]), tc.max_len) for s in seqs], dtype=np.int64)
    layout = build_layout(
        lengths, anchors, block, tc.batch_anchors if fixed_shapes else 0, tc.batch_tokens if fixed_shapes else 0
    )
    real = layout.real_anchors
    context_ids = np.zeros(layout.context_rows, dtype=np.int64)  # the sequences one after another, then padding
    context_ids[: lengths.sum()] = np.concatenate([np.asarray(s["ids"][:n]) for s, n in zip(seqs, lengths)])
    flat_labelled = np.concatenate(
        [label_mask(len(s["ids"]), s["spans"], tc.max_len)[:n] for s, n in zip(seqs, lengths)]
    )
    seq, pos = layout.anchor_seq[:real], layout.anchor_pos[:real]
    first_row = layout.starts[seq] + pos
    block_ids = np.full((len(layout.anchor_seq), block), tc.mask_token_id, dtype=np.int64)
    block_ids[:real, 0] = context_ids[first_row]
    inside = pos[:, None] + np.arange(1, block) < lengths[seq][:, None]
    label_row = np.where(inside, first_row[:, None] + np.arange(1, block), 0)
    decay = np.exp(-np.arange(block - 1) / tc.gamma)
    weights = (decay * (inside & flat_labelled[label_row])).astype(np.float32)
    return HostBatch(
        layout,
        context_ids,
        block_ids,
        np.where(inside, context_ids[label_row], 0),
        weights,
        np.flatnonzero(weights.reshape(-1) > 0),
    )


@torch.no_grad()
def target_inputs(
    draft, target, host: HostBatch, device_layout: DeviceLayout, mask, attend, run, device: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """(the tapped target layers of every context row [context rows, taps x hidden]; the target's embedding of every
    block row [query rows, hidden]): the target runs over the context rows, each sequence attending within itself
    (train.target_taps; `run` is tapped_states, compiled or not)."""
    ids = to_device(host.context_ids, device)
    taps = run(target, ids, device_layout.context_pos, mask, attend, tuple(draft.spec.target_layer_ids))
    return taps, target.get_input_embeddings()(to_device(host.block_ids.reshape(-1), device))


def block_loss(
    draft, target, seqs: list[dict], anchors: list[np.ndarray], tc, device: str, fixed_shapes: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(weighted CE over the blocks, the draft's greedy predictions [A, B-1] (-1 where a label weighs nothing), the
    labels' weights [A, B-1]) for the anchors of each sequence (sorted). `fixed_shapes`: the layout is padded to
    tc.batch_anchors anchors and tc.batch_tokens context rows, so that both compiled forwards keep their shapes."""
    cuda = device.startswith("cuda")
    with record_function("train.host_batch"):
        host = host_batch(seqs, anchors, tc, fixed_shapes)
    layout, block, real = host.layout, tc.block, host.layout.real_anchors
    device_layout = layout_on(device, layout, draft.spec.causal, fixed_shapes)
    masks, attend, run_target, run_draft = runners(device_layout, {*draft.spec.windows, CONTEXT}, cuda, fixed_shapes)
    with record_function("train.target"):
        taps, embeds = target_inputs(draft, target, host, device_layout, masks.pop(CONTEXT), attend, run_target, device)
    with record_function("train.draft_forward"):
        query_pos = to_device((layout.anchor_pos[:, None] + np.arange(block)).reshape(-1), device)
        autocast = cuda and torch.is_autocast_enabled("cuda")
        hidden = run_draft(
            draft,
            taps,
            embeds,
            device_layout.context_pos,
            query_pos,
            masks,
            attend,
            torch.get_autocast_dtype("cuda") if autocast else None,
        )
    with record_function("train.head_loss"):
        hidden = hidden.view(-1, block, hidden.shape[-1])[:real, 1:].flatten(0, 1)
        rows = to_device(host.kept, device)
        total, guesses = head_cross_entropy(
            hidden.index_select(0, rows),
            target.lm_head.weight,
            to_device(host.labels.reshape(-1)[host.kept], device),
            to_device(host.weights.reshape(-1)[host.kept], device),
        )
        loss = total / max(float(host.weights.sum()), 1e-6)
        predictions = torch.full((real * (block - 1),), -1, dtype=torch.long, device=device)
        predictions[rows] = guesses
    return loss, predictions.view(real, block - 1), to_device(host.weights, device).view(real, block - 1)
