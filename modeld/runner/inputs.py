"""A step's inputs on the device: one int64 array [FIELDS, width] that reaches the device in one copy, whose rows
the forward reads as views (per token: ids, positions, target slots; per request: req_to_token row, first new
position, new tokens, K/V length after the step, first token in the packed ids; then where the DFLASH drafts go in
the ids); and the next step's inputs made from them on the device.

Moving the inputs on by a step on the device lets one CUDA graph replay (or a chain of replays) run several decode
steps, or greedy DFLASH cycles, back to back without the host. Invariant that makes this sound: memd writes
req_to_token for every position it grants before it answers, and a batch runs several steps without the host only
when every request holds (is granted) every position those steps can reach (ModelRunner.steps_ahead). So the target
slot of position p of a request is req_to_token[row, p], read on the device; a padding request keeps slot -1 (it
writes no K/V) and row 0."""

from dataclasses import dataclass

import torch

from modeld.engine.step_items import StepItem
from modeld.model.causal_lm import ForwardBatch

IDS, POSITIONS, SLOTS, ROWS, STARTS, LENS, KV_LENS, INDPTR, DRAFT_AT = range(9)
FIELDS = 9


@dataclass
class StepInputs:
    batch: ForwardBatch
    offsets: list[int]  # first token of each item
    num_tokens: int  # real tokens (the batch may be padded to a graph's shape)
    draft_at: torch.Tensor  # [V * (block - 1)]: where the verify items' drafts go in input_ids
    verify: list[int]  # indexes of the verify items
    graph: tuple[int, int] | None  # (bucket, tokens per request) when a captured graph runs the step
    packed: torch.Tensor  # [fields, width] on the device: the batch's tensors are views of its rows

    def verify_inputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The verify items' req_to_token rows, first new positions and last committed tokens, on the device."""
        b, n = self.batch, len(self.verify)
        if n == len(self.offsets):  # every item verifies a block: the common step, read in place
            block = self.num_tokens // n
            return b.rows[:n], b.q_starts[:n], b.input_ids[: n * block].view(n, block)[:, 0]
        idx = torch.tensor(self.verify, dtype=torch.int64, device=b.rows.device)
        firsts = torch.tensor([self.offsets[i] for i in self.verify], dtype=torch.int64, device=b.rows.device)
        return b.rows[idx], b.q_starts[idx], b.input_ids[firsts]

    def put_drafts(self, drafts: torch.Tensor) -> None:
        """The proposed drafts [V, block - 1] (on the device) into the verify items' input ids."""
        self.batch.input_ids.index_copy_(0, self.draft_at, drafts.reshape(-1))


def advances_on_device(items: list[StepItem]) -> bool:
    """Whether the step after this one is each item's own output fed back, as advance_inputs makes it on the device:
    every item a verify block, or one token that samples (a decode, or a prompt's last token). A prompt chunk of
    several tokens is neither, even one as long as a DFLASH block (whose verify graph it replays)."""
    return all(item.verify or item.num_tokens == 1 == item.req.pending for item in items)


def row_index(rows: list[int], total: int, device) -> slice | torch.Tensor:
    """An index of `rows` out of `total`: a slice when it is all of them in order (no copy to the device)."""
    if len(rows) == total and rows == list(range(total)):
        return slice(None)
    return torch.tensor(rows, dtype=torch.int64, device=device)


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
