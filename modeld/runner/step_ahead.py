"""A plain decode step queued on the device before the host reads the tokens of the step before it (on CUDA by
default; `--disable-overlap-decode` turns it off): while the GPU computes step N+1, the engine thread commits
step N's tokens, streams them and decides whether N+2 can follow. A batch-1 step of the default model was host
work, then device work, then host work in series (BENCHMARKS.md, bench.engine.step_span: 0.70 ms of GPU in a 1.39 ms
step); this puts the host's part beside the device's.

Step N+1 is the same batch one token further: its inputs are moved on by step N's tokens on the device
(modeld.runner.step_advance, as decode_chain does), so it is queued only when the scheduler would plan exactly that step
with no memd call due (Scheduler.continues) and nothing new has arrived. A request that finishes or is aborted at
step N has computed one token too many in N+1: that token is dropped, and its K/V went to a position memd granted
it (never another request's), which its release frees.

Invariant: at most one step is queued ahead, and no memd call goes out while it is: every path that calls memd
(the scheduler's next step, the idle pass's releases, failing what runs) first commits or drops the step ahead,
so memd never frees or regrants a slot that a queued step still writes or a row it still reads.
"""

from dataclasses import dataclass

import torch

from modeld.engine.scheduler import StepItem
from modeld.runner.decode_chain import decode_chain
from modeld.runner.model_runner import ModelRunner, StepInputs


@dataclass
class HostCopy:
    """A host copy of a step's tokens queued behind the step (pinned memory on a GPU), complete once `ready` is
    (None: complete already): reading it waits for that step only, not for a step queued after it."""

    host: torch.Tensor
    ready: torch.cuda.Event | None

    @classmethod
    def of(cls, tokens: torch.Tensor) -> "HostCopy":
        """Queue it before the next step's replay, which writes the graph's output buffer again."""
        if not tokens.is_cuda:
            return cls(tokens.clone(), None)
        host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
        host.copy_(tokens, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return cls(host, ready)

    def wait(self) -> None:
        if self.ready is not None:
            self.ready.synchronize()

    def values(self) -> list[int]:
        self.wait()
        return self.host.tolist()


@dataclass
class Queued:
    """A decode step on the device: its items, inputs (moved on in place), its tokens on the device (the next step's
    inputs) and their host copy."""

    items: list[StepItem]
    inputs: StepInputs
    tokens: torch.Tensor
    copy: HostCopy


class StepAhead:
    def __init__(self, runner: ModelRunner, dflash, enabled: bool):
        self.runner = runner
        self.dflash = dflash  # its draft context is written by every decode (speculation off for a large batch)
        self.enabled = enabled
        self.queued: Queued | None = None

    def queue_next(self, items: list[StepItem], inputs: StepInputs, tokens: torch.Tensor) -> None:
        """Queues the decode step after the one whose tokens (on the device, [items]) are `tokens`: the same batch,
        fed those tokens, at the next position of every request (a decode chain of one step, writing the draft's
        context with DFLASH)."""
        following = decode_chain(
            self.runner,
            self.dflash,
            inputs,
            [item.req.params for item in items],
            [item.req.generator for item in items],
            1,
            fed=tokens,
        )[0]
        self.queued = Queued(items, inputs, following, HostCopy.of(following))

    def take(self) -> Queued | None:
        queued, self.queued = self.queued, None
        return queued

    def drop(self) -> None:
        """Forgets the step queued ahead once the device has run it (its tokens are not committed): then nothing
        queued touches memd's pools, and memd may free what it wrote."""
        queued = self.take()
        if queued is not None:
            queued.copy.wait()
