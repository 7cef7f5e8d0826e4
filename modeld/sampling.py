"""Sampling parameters, their validation, and the sampler (greedy, temperature, top-k, top-p)."""

import math
from dataclasses import dataclass

import torch

DEFAULT_MAX_NEW_TOKENS = 128
GREEDY_BELOW = 1e-5  # temperature: the limit of sampling as T -> 0 is the argmax, and logits / T stay finite above


class InvalidRequest(ValueError):
    """Bad input from a client: answered with INVALID_ARGUMENT and this message."""


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise InvalidRequest(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise InvalidRequest(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise InvalidRequest(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise InvalidRequest(f"top_k must be >= 0, got {self.top_k}")
        if any(not s for s in self.stop):
            raise InvalidRequest("stop strings must not be empty")

    @property
    def greedy(self) -> bool:
        """Temperatures below GREEDY_BELOW sample the argmax (dividing logits by them would overflow)."""
        return self.temperature < GREEDY_BELOW or self.top_k == 1


def sample(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]) -> torch.Tensor:
    """One token per row of logits [B, V] (fp32), as an int64 tensor on the logits' device: nothing here waits for
    the device. Greedy rows take the argmax; every other row draws from its own filtered distribution with its
    request's generator (so a seeded request samples the same tokens whatever it is batched with)."""
    out = logits.argmax(dim=-1)
    for i, p in enumerate(params):
        if not p.greedy:
            out[i] = torch.multinomial(filtered_probs(logits[i], p), 1, generator=generators[i])[0]
    return out


def filtered_probs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Probabilities after temperature, top-k and top-p (the smallest set whose mass reaches top_p)."""
    logits = logits.float() / p.temperature
    if p.top_k:
        kth = torch.topk(logits, min(p.top_k, logits.shape[-1])).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if p.top_p < 1:
        sorted_probs, order = probs.sort(descending=True)
        before = sorted_probs.cumsum(-1) - sorted_probs  # mass strictly before each token
        sorted_probs[before >= p.top_p] = 0
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        probs = probs / probs.sum()
    return probs
