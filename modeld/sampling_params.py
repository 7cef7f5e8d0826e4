"""A request's sampling parameters and their validation: what the gRPC front checks and the engine samples by (no
torch here: the front imports this)."""

import json
import math
from dataclasses import dataclass, field

DEFAULT_MAX_NEW_TOKENS = 128
GREEDY_BELOW = 1e-5  # temperature: the limit of sampling as T -> 0 is the argmax, and logits / T stay finite above
MAX_TOP_LOGPROBS = 20  # OpenAI's bound
MAX_CONSTRAINT_BYTES = 64 << 10  # a schema or regex: compiling is paid per distinct constraint, so it is bounded
CONSTRAINT_KINDS = ("json_schema", "regex", "json_object")


class InvalidRequest(ValueError):
    """Bad input from a client: answered with INVALID_ARGUMENT and this message."""


@dataclass(frozen=True)
class Constraint:
    """What the output must match: a JSON schema (its JSON text), a regex, or any JSON object (text empty). Checked
    here for its form and size; the engine's grammar compiler checks the rest before any KV is allocated."""

    kind: str
    text: str = ""

    def __post_init__(self):
        if self.kind not in CONSTRAINT_KINDS:
            raise InvalidRequest(f"constraint kind {self.kind!r}: one of {', '.join(CONSTRAINT_KINDS)}")
        size = len(self.text.encode())
        if size > MAX_CONSTRAINT_BYTES:
            raise InvalidRequest(f"the {self.kind} constraint is {size} bytes, more than {MAX_CONSTRAINT_BYTES}")
        if self.kind == "json_schema":
            try:
                schema = json.loads(self.text)
            except ValueError as exc:
                raise InvalidRequest(f"json_schema is not JSON: {exc}") from None
            if not isinstance(schema, dict):
                raise InvalidRequest("json_schema must be a JSON object")
        elif self.kind == "regex" and not self.text:
            raise InvalidRequest("the regex constraint is empty")


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
    constraint: Constraint | None = None
    logprobs: bool = False  # the chosen token's log probability at each output position
    top_logprobs: int = 0  # and the most likely tokens' (needs logprobs)
    # The request's tokens need the host at every step (a grammar's mask, log probabilities): its steps run one at a
    # time, never in a multi-step replay or ahead of the host. A field, not a property: read per item per step.
    host_rules: bool = field(init=False, default=False)

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
        if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise InvalidRequest(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {self.top_logprobs}")
        if self.top_logprobs and not self.logprobs:
            raise InvalidRequest("top_logprobs needs logprobs")
        if self.constraint is not None and self.ignore_eos:
            raise InvalidRequest("a constraint ends the output where its grammar does: ignore_eos does not go with it")
        object.__setattr__(self, "host_rules", self.constraint is not None or self.logprobs)

    @property
    def greedy(self) -> bool:
        """Temperatures below GREEDY_BELOW sample the argmax (dividing logits by them would overflow)."""
        return self.temperature < GREEDY_BELOW or self.top_k == 1
