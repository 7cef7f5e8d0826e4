"""The per-anchor training loss the packed one (train.block_loss) must equal: each anchor gathers its own context
window of every layer's context K/V and runs the draft's inference path (DFlashDraft.block_hidden, the serving
module's attention), and the full logits go through torch's cross-entropy. Slow, and simple enough to trust."""

import numpy as np
import torch

from train.batches import label_mask


def per_anchor_loss(
    draft, target, seqs: list[dict], anchors: list[np.ndarray], tc, device: str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(weighted CE over the blocks, the draft's greedy predictions [A, B-1], the labels' weights [A, B-1])."""
    width = min(max(len(s["ids"]) for s in seqs), tc.max_len)
    lengths = np.array([min(len(s["ids"]), width) for s in seqs])
    ids = torch.zeros((len(seqs), width), dtype=torch.long)
    lmask = torch.zeros((len(seqs), width), dtype=torch.bool)
    for i, (s, n) in enumerate(zip(seqs, lengths)):
        ids[i, :n] = torch.as_tensor(np.asarray(s["ids"][:n], dtype=np.int64))
        lmask[i, :n] = torch.as_tensor(label_mask(len(s["ids"]), s["spans"], width)[:n])
    ids, lmask = ids.to(device), lmask.to(device)
    attn = (torch.arange(width, device=device) < torch.as_tensor(lengths, device=device)[:, None]).long()
    with torch.no_grad():
        states = target.model(ids, attention_mask=attn, output_hidden_states=True).hidden_states
        taps = torch.cat([states[i + 1] for i in draft.spec.target_layer_ids], dim=-1).float()
    positions = torch.arange(width, device=device).expand(len(seqs), -1)
    ctx = draft.context_kv(taps.flatten(0, 1), positions.flatten())
    seq_of = torch.as_tensor(np.concatenate([np.full(len(a), i) for i, a in enumerate(anchors)]), device=device)
    anchor = torch.as_tensor(np.concatenate(anchors).astype(np.int64), device=device)
    offsets = torch.arange(tc.block, device=device)
    block_pos = anchor[:, None] + offsets
    inside = block_pos < width
    label_pos = block_pos.clamp(max=width - 1)
    block_ids = torch.full_like(block_pos, tc.mask_token_id)
    block_ids[:, 0] = ids[seq_of, anchor]
    contexts = []
    for layer, window in enumerate(draft.spec.windows):
        span = (window - 1) if window is not None else max(1, int(anchor.max()))
        pos = anchor[:, None] - span + torch.arange(span, device=device)
        valid = pos >= 0
        rows = seq_of[:, None] * width + pos.clamp(min=0)
        visible = valid[:, None, :].expand(-1, tc.block, -1)
        if window is not None:
            visible = visible & (block_pos[:, :, None] - pos[:, None, :] < window)
        keep = valid[:, :, None, None]
        k, v = (torch.where(keep, x[rows], 0) for x in ctx[layer])
        contexts.append((k, v, visible))
    with torch.no_grad():
        embeds = target.get_input_embeddings()(block_ids).float()
    hidden = draft.block_hidden(embeds, block_pos, contexts)[:, 1:]
    logits = target.lm_head(hidden.to(target.lm_head.weight.dtype)).float()
    labels = ids[seq_of[:, None], label_pos[:, 1:]]
    decay = torch.exp(-(offsets[1:] - 1) / tc.gamma)
    weights = decay * (inside[:, 1:] & lmask[seq_of[:, None], label_pos[:, 1:]]).float()
    losses = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none").view_as(labels)
    return (losses * weights).sum() / weights.sum().clamp(min=1e-6), logits.argmax(-1), weights
