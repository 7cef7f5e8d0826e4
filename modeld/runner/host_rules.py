"""A step's host rules: the grammar masks and log probabilities of the requests that ask for them
(SamplingParams.host_rules). Such a request runs its steps one at a time (never in a multi-step replay, a greedy
cycle or a step queued ahead), because each of its tokens must pass the host: the next mask depends on it.

The masks are built on the host: for a decode or a prompt's last chunk, one row from the grammar's state; for a
verify block, a row per position along the drafts (modeld.grammar.matcher), from the drafts' host copy, queued
before the target's forward so that the masks are built while the device runs it. Log probabilities (after
temperature and mask, as OpenAI gives them; a greedy request's at temperature 1) leave the device with the step's
tokens, in one copy."""

from dataclasses import dataclass

import torch

from modeld.engine.step_items import StepItem
from modeld.grammar.mask import apply_bitmask
from modeld.grammar.matcher import bitmask_rows
from modeld.request import TokenLogprob
from modeld.runner.steps_ahead import HostCopy
from modeld.sampling_params import GREEDY_BELOW


@dataclass
class HostRules:
    items: list[StepItem]
    counts: list[int]  # sampled rows per item (a verify block's every row, a finishing prompt's or decode's one)
    firsts: list[int]  # each item's first sampled row
    drafts: HostCopy | None = None  # the verify items' drafts [V, B-1], copied before the forward
    top_k: int = 0  # the width of the step's top log probabilities (its largest top_logprobs)
    bitmask: torch.Tensor | None = None  # [sampled rows, words] on the host, once built

    def copy_drafts(self, drafts: torch.Tensor | None) -> None:
        """Queues the host copy of the drafts, when a verify item has a grammar (before the forward is queued)."""
        if drafts is not None and any(item.verify and item.req.grammar is not None for item in self.items):
            self.drafts = HostCopy.of(drafts)

    def drafts_on_host(self) -> list[list[int]] | None:
        """The drafts' host copy, once the device has made them (the target's forward goes on meanwhile)."""
        return self.drafts.values() if self.drafts is not None else None

    def build_masks(self, rows: int, vocab_size: int, drafts: list[list[int]] | None) -> None:
        """Each grammar's masks at its sampled rows into a host bitmask (None without a grammar in the step)."""
        grammars = [i for i, item in enumerate(self.items) if item.req.grammar is not None and self.counts[i]]
        if not grammars:
            return
        self.bitmask = bitmask_rows(rows, vocab_size)
        verify_index = {i: n for n, i in enumerate(i for i, item in enumerate(self.items) if item.verify)}
        for i in grammars:
            item = self.items[i]
            if item.verify:
                item.req.grammar.fill_block(self.bitmask, self.firsts[i], drafts[verify_index[i]])
            else:
                item.req.grammar.fill(self.bitmask, self.firsts[i])

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [sampled rows, V] with the built masks applied (unchanged without a grammar)."""
        return logits if self.bitmask is None else apply_bitmask(logits, self.bitmask)

    def logprob_values(self, logits: torch.Tensor, sampled: torch.Tensor) -> torch.Tensor | None:
        """[rows, 1 + 2 k] float64 on the device for the sampled rows of requests with logprobs (k: the step's
        largest top_logprobs): the chosen token's log probability, then the top k's ids and log probabilities."""
        rows, temperatures = [], []
        for i, item in enumerate(self.items):
            if item.req.params.logprobs:
                rows += range(self.firsts[i], self.firsts[i] + self.counts[i])
                temperatures += [self._temperature(item)] * self.counts[i]
        if not rows:
            return None
        index = torch.tensor(rows, dtype=torch.int64, device=logits.device)
        temperature = torch.tensor(temperatures, dtype=torch.float32).to(logits.device)
        logprobs = torch.log_softmax(logits[index].float() / temperature[:, None], dim=-1)
        chosen = logprobs.gather(1, sampled[index][:, None])
        self.top_k = max(item.req.params.top_logprobs for item in self.items)
        top = logprobs.topk(self.top_k, dim=-1)
        return torch.cat([chosen.double(), top.indices.double(), top.values.double()], dim=1)

    @staticmethod
    def _temperature(item: StepItem) -> float:
        params = item.req.params
        return 1.0 if params.temperature < GREEDY_BELOW else params.temperature

    def read_logprobs(self, values: list[float], committed: list[int]) -> list[list[TokenLogprob] | None]:
        """Per item, its committed tokens' TokenLogprob (None for an item without logprobs); values: the host copy
        of logprob_values, committed: each item's committed token count."""
        k = self.top_k
        width = 1 + 2 * k
        out, at = [], 0
        for i, item in enumerate(self.items):
            params = item.req.params
            if not params.logprobs:
                out.append(None)
                continue
            entries = []
            for j in range(committed[i]):
                row = values[(at + j) * width : (at + j + 1) * width]
                top = tuple(
                    (int(token), lp)
                    for token, lp in zip(row[1 : 1 + k][: params.top_logprobs], row[1 + k :][: params.top_logprobs])
                    if lp != float("-inf")  # a token the mask forbids is no alternative
                )
                entries.append(TokenLogprob(row[0], top))
            out.append(entries)
            at += self.counts[i]
        return out

    def advance(self, committed_tokens: list[list[int]]) -> None:
        """Each grammar takes the tokens its request committed this step."""
        for item, tokens in zip(self.items, committed_tokens):
            if item.req.grammar is not None and tokens:
                item.req.grammar.advance(tokens)
