"""What the scheduler hands the runner: each request's part of a step, planned (PlanItem), then granted by memd
(StepItem)."""

from dataclasses import dataclass

from modeld.request import Request


@dataclass
class StepItem:
    req: Request
    num_tokens: int
    row: int
    slots: list[int]  # target slots of the new positions
    verify: bool = False  # a DFLASH block: [last token, drafts] (the drafts are proposed on the device)


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ cost about 8 us a step at 16 requests
class PlanItem:
    """A request's part of a planned step, before memd answers (then a StepItem)."""

    req: Request
    num_tokens: int
    decode: bool  # a decode (one token, or a DFLASH verify block); else a prompt chunk
    ask: int  # positions to ask memd for beyond those the request holds (0: it runs on slots it holds)
