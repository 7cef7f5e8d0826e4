"""Turns a scheduled step into one forward over memd's pools and returns the logits to sample."""

import torch

from modeld.model import CausalLM, ForwardBatch
from modeld.scheduler import StepItem


class ModelRunner:
    def __init__(self, model: CausalLM, pools: dict[str, torch.Tensor], device: str):
        self.model = model
        self.kv_pool = pools["target_kv"]
        self.req_to_token = pools["req_to_token"]
        self.device = device

    def forward(self, items: list[StepItem]) -> tuple[list[StepItem], torch.Tensor]:
        """Computes K/V of every item's new tokens; returns the items that reach their last
        token this step and the fp32 logits at that token, one row each."""
        ids, positions, slots, sample_at = [], [], [], []
        for item in items:
            start = item.req.computed
            ids += item.req.all_ids[start : start + item.num_tokens]
            positions += range(start, start + item.num_tokens)
            slots += item.slots
            if item.num_tokens == item.req.pending:
                sample_at.append(len(ids) - 1)
        as_tensor = lambda values: torch.tensor(values, dtype=torch.int64, device=self.device)  # noqa: E731
        batch = ForwardBatch(
            input_ids=as_tensor(ids),
            positions=as_tensor(positions),
            out_slots=as_tensor(slots),
            rows=as_tensor([i.row for i in items]),
            q_starts=as_tensor([i.req.computed for i in items]),
            q_lens=as_tensor([i.num_tokens for i in items]),
            kv_lens=as_tensor([i.req.computed + i.num_tokens for i in items]),
            req_to_token=self.req_to_token,
        )
        hidden, _ = self.model(batch, self.kv_pool)
        sampling = [item for item in items if item.num_tokens == item.req.pending]
        return sampling, self.model.logits(hidden[as_tensor(sample_at)])
