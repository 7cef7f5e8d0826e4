"""A generation request inside modeld: its tokens, progress, and the events it streams out."""

import queue
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from modeld.sampling_params import SamplingParams

if TYPE_CHECKING:  # the gRPC front builds requests too, and imports no torch
    import torch


@dataclass
class Finish:
    reason: str  # "stop" | "length" | "abort"
    matched_stop: str = ""
    error_code: str = ""  # a gRPC status name when the request failed
    error: str = ""


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """An output token's log probability under the distribution it was drawn from (after temperature and a
    constraint's mask), and the top alternatives' as (token id, log probability), most likely first."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class Request:
    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    generator: "torch.Generator | None" = None
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[TokenLogprob] = field(default_factory=list)  # one per output token, with params.logprobs
    grammar: object = None  # modeld.grammar.matcher.RequestGrammar of its constraint, once compiled
    computed: int = 0  # positions whose K/V are in memd's pools
    in_memd: bool = False  # memd holds a row and slots for it
    row: int = 0  # memd's req_to_token row while in memd
    held: int = 0  # positions memd holds slots for (>= computed: decode slots are granted ahead)
    slots: list[int] = field(default_factory=list)  # target slots of positions [slots_from, held)
    slots_from: int = 0
    arrived: float = field(default_factory=time.perf_counter)
    first_token_at: float = 0.0  # perf_counter time of the step that produced the first token
    cached_tokens: int = 0
    spec_verify_ct: int = 0
    # Output tokens of decode steps that verified no block (DFLASH off while the batch is large, or a block that no
    # longer fits the context): not part of the accept length (accept_length()).
    unverified_tokens: int = 0
    finish: Finish | None = None
    text_stream: object = None  # modeld.detokenize.TextStream of output_ids, made on the engine thread for stop strings
    sent_ids: int = 0  # output tokens already streamed
    unsent_text: str = ""  # with stop strings: text of output tokens not streamed yet (the stream interval)
    events: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)  # C-implemented: a put per step per request
    stream: bool = True  # False: only "complete" is read (in-process bulk generation): no chunk events, no text
    wakeup: object = None  # its gRPC handler's asyncio.Event, set on the handler's loop once events are queued

    def accept_length(self) -> float:
        """Tokens per DFLASH verify step, bonus included: completion tokens / verify steps as SGLang reports it,
        without the tokens of decode steps that verified nothing; 0 without a verify step."""
        if not self.spec_verify_ct:
            return 0.0
        return (len(self.output_ids) - self.unverified_tokens) / self.spec_verify_ct

    @property
    def engine_text(self) -> str:
        """The text the engine thread made (requests with stop strings; "" for the others, whose handler makes it)."""
        return self.text_stream.sent if self.text_stream is not None else ""

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    def token_at(self, position: int) -> int:
        """all_ids[position] without building all_ids (the hot path's cost must not grow with the output)."""
        n = len(self.prompt_ids)
        return self.prompt_ids[position] if position < n else self.output_ids[position - n]

    def tokens(self, start: int, end: int) -> list[int]:
        """all_ids[start:end] without building all_ids."""
        n = len(self.prompt_ids)
        if end <= n:
            return self.prompt_ids[start:end]
        if start >= n:
            return self.output_ids[start - n : end - n]
        return self.prompt_ids[start:] + self.output_ids[: end - n]

    @property
    def pending(self) -> int:
        """Tokens whose K/V are not computed yet (prompt chunks, or the last sampled token)."""
        return len(self.prompt_ids) + len(self.output_ids) - self.computed
