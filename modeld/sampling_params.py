"""A request's sampling parameters and their validation: what the gRPC front checks and the engine samples by (no
torch here: the front imports this)."""

import math
from dataclasses import dataclass

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
