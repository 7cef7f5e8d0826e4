"""The next step's inputs of a replayed batch, computed on the device from the step that just ran, so that one CUDA
graph replay can run several decode steps (or greedy DFLASH cycles) back to back without the host.

Invariant that makes this sound: memd writes req_to_token for every position it grants before it answers, and a
batch runs several steps in one replay only when every request holds (is granted) every position those steps can
reach (modeld.runner.model_runner.ModelRunner.steps_ahead). So the target slot of position p of a request is
req_to_token[row, p], read on the device; a padding request keeps slot -1 (it writes no K/V) and row 0."""

import torch

from modeld.runner.packed_inputs import IDS, KV_LENS, POSITIONS, ROWS, SLOTS, STARTS


def advance_inputs(
    static: torch.Tensor,
    bucket: int,
    q: int,
    committed: torch.Tensor,
    last_tokens: torch.Tensor,
    req_to_token: torch.Tensor,
) -> None:
    """Moves each of the `bucket` requests of the packed inputs `static` [fields, width] on by the tokens it
    committed (committed [bucket]: 1 per plain decode; a verify's accepted length, 0 for padding) and makes its
    next q tokens: the last committed token first (last_tokens [bucket]), then what the step fills in itself
    (a DFLASH block's drafts), at positions start .. start + q - 1 and the slots memd granted them."""
    n = bucket * q
    starts = static[STARTS, :bucket]
    starts += committed
    static[KV_LENS, :bucket] = starts + q
    positions = starts[:, None] + torch.arange(q, device=static.device)  # [bucket, q]
    static[POSITIONS, :n] = positions.view(-1)
    slots = static[SLOTS, :n].view(bucket, q)
    real = slots[:, :1] >= 0  # padding requests: slot -1, before and after
    granted = req_to_token[static[ROWS, :bucket, None], positions].to(torch.int64)
    slots.copy_(torch.where(real, granted, torch.full_like(granted, -1)))
    static[IDS, :n].view(bucket, q)[:, 0] = last_tokens
