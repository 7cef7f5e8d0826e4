"""A generation request inside modeld: its tokens, progress, and the events it streams out."""

import queue
from dataclasses import dataclass, field

import torch

from modeld.sampling import SamplingParams


@dataclass
class Finish:
    reason: str  # "stop" | "length" | "abort"
    matched_stop: str = ""
    error_code: str = ""  # a gRPC status name when the request failed
    error: str = ""


@dataclass
class Request:
    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    generator: torch.Generator | None = None
    output_ids: list[int] = field(default_factory=list)
    computed: int = 0  # positions whose K/V are in memd's pools
    in_memd: bool = False  # memd holds a row and slots for it
    cached_tokens: int = 0
    spec_verify_ct: int = 0
    finish: Finish | None = None
    sent_text: str = ""  # text already streamed
    sent_ids: int = 0  # output tokens already streamed
    events: queue.Queue = field(default_factory=queue.Queue)

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def pending(self) -> int:
        """Tokens whose K/V are not computed yet (prompt chunks, or the last sampled token)."""
        return len(self.prompt_ids) + len(self.output_ids) - self.computed
