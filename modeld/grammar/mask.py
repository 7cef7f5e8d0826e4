"""Applying grammar bitmasks to logits on their device."""

import torch

BITS = 32


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """logits [R, V] with every token whose bit is clear in bitmask [R, words] (int32, bit i of word w is token
    32 w + i) set to -inf; a new tensor. Ids past the bitmask's words are never allowed (none exist: words cover V)."""
    shifts = torch.arange(BITS, dtype=torch.int32, device=logits.device)
    words = bitmask.to(logits.device, non_blocking=True)
    allowed = ((words[:, :, None] >> shifts) & 1).bool().view(words.shape[0], -1)[:, : logits.shape[1]]
    return logits.masked_fill(~allowed, float("-inf"))
