"""Turns a scheduled step into one forward over memd's pools."""

from dataclasses import dataclass

import torch

from modeld.model import CausalLM, ForwardBatch
from modeld.scheduler import StepItem


@dataclass
class StepOutput:
    hidden: torch.Tensor  # [T, hidden]: the final hidden state of every token of the step
    captured: list[torch.Tensor]  # per tapped layer [T, hidden] (DFLASH)
    offsets: list[int]  # first row of each item in `hidden`
    positions: torch.Tensor  # [T]
    slots: torch.Tensor  # [T] target slots


class ModelRunner:
    def __init__(self, model: CausalLM, pools: dict[str, torch.Tensor], device: str):
        self.model = model
        self.device = device
        self.bind(pools)

    def bind(self, pools: dict[str, torch.Tensor]) -> None:
        """memd's buffers (again after a re-attach)."""
        self.kv_pool = pools["target_kv"]
        self.req_to_token = pools["req_to_token"]

    def tensor(self, values) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=self.device)

    def forward(self, items: list[StepItem], capture=()) -> StepOutput:
        """Computes (and stores) the K/V of every item's new tokens: an item's tokens are its
        block (`item.tokens`, DFLASH verification) or its request's next tokens."""
        ids, positions, slots, offsets = [], [], [], []
        for item in items:
            start = item.req.computed
            offsets.append(len(ids))
            ids += item.tokens if item.tokens is not None else item.req.all_ids[start : start + item.num_tokens]
            positions += range(start, start + item.num_tokens)
            slots += item.slots
        batch = ForwardBatch(
            input_ids=self.tensor(ids),
            positions=self.tensor(positions),
            out_slots=self.tensor(slots),
            rows=self.tensor([i.row for i in items]),
            q_starts=self.tensor([i.req.computed for i in items]),
            q_lens=self.tensor([i.num_tokens for i in items]),
            kv_lens=self.tensor([i.req.computed + i.num_tokens for i in items]),
            req_to_token=self.req_to_token,
        )
        hidden, captured = self.model(batch, self.kv_pool, capture_layers=capture)
        return StepOutput(hidden, captured, offsets, batch.positions, batch.out_slots)
