"""Decode steps run ahead of the host. Two ways, one mechanism (each step's inputs are the last step's made on the
device by modeld.runner.inputs.advance_inputs):

- A decode chain: k decode steps of one batch launched back to back, with one copy of their tokens to the host at
  the end, so the host's work per step (the tokens' copy and wait, commit, output, scheduling, packing) is paid once
  per k steps. It serves the decode batches that the fused k-step graph (modeld.runner.graphs) does not: requests
  that sample, plain decodes beside a DFLASH draft's context (speculation off for a large batch), the CPU. Each step
  runs the batch's one-step graph (or the eager forward), picks its tokens on the device (the graph's argmax, or
  the sampler with each request's own generator, drawn in the same order as one step at a time), and writes the
  draft context.
- The step ahead (on CUDA by default; Tuning.overlap_decode): a plain decode step queued on the device before the
  host reads the tokens of the step before it, as a chain of one. While the GPU computes step N+1, the engine
  commits step N's tokens, streams them and decides whether N+2 can follow; the next engine pass finishes it. It is
  queued only when the scheduler would plan exactly that step with no memd call due (Scheduler.continues) and
  nothing new has arrived. A request that finishes or is aborted at step N has computed one token too many in N+1:
  that token is dropped, and its K/V went to a position memd granted it (never another request's), which its
  release frees.

Invariants: every request holds every position the steps reach (ModelRunner.steps_ahead), so each step's slots are
in req_to_token before the steps start; and at most one step is pending, with no memd call going out while it is:
every path that calls memd (the scheduler's next step, the idle pass's releases, failing what runs) first finishes
or drops the pending step, so memd never frees or regrants a slot that a pending step still writes or a row it
still reads.
"""

from dataclasses import dataclass

import torch

from modeld.engine.step_items import StepItem
from modeld.runner.inputs import StepInputs, advance_inputs
from modeld.runner.sampling import sample
from modeld.sampling_params import SamplingParams


def decode_chain(
    runner,
    dflash,
    inputs: StepInputs,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
    k: int,
    fed: torch.Tensor | None = None,
) -> torch.Tensor:
    """k decode steps of the prepared batch (every item one token a step, params and generators per item): each
    step's token per item [k, items], on the device. With `fed` (tokens [items] on the device), the batch is first
    moved on by them: its steps follow one whose tokens are not committed yet (StepAhead)."""
    n = len(inputs.offsets)
    bucket = inputs.graph[0] if inputs.graph is not None else n
    device = inputs.packed.device
    ones = torch.ones(bucket, dtype=torch.int64, device=device)
    last = torch.zeros(bucket, dtype=torch.int64, device=device)  # padding requests: token 0 (they write no K/V)
    greedy = all(p.greedy for p in params)
    tokens = torch.empty((k, n), dtype=torch.int64, device=device)
    for step in range(k):
        feed = tokens[step - 1] if step else fed
        if feed is not None:
            last[:n] = feed
            advance_inputs(inputs.packed, bucket, 1, ones, last, runner.req_to_token)
        out = runner.forward(inputs)
        if greedy and out.greedy is not None:  # the decode graph took the argmax of every row
            tokens[step] = out.greedy
        else:
            tokens[step] = sample(runner.model.logits(out.hidden), params, generators)
        if dflash is not None:  # the draft's context K/V of the step's tokens
            dflash.after_forward(inputs, out, None, None)
    return tokens


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
class PendingStep:
    """A decode step on the device whose tokens the next engine pass reads: its items, inputs (moved on in place),
    its tokens on the device (the next step's inputs) and their host copy."""

    items: list[StepItem]
    inputs: StepInputs
    tokens: torch.Tensor
    copy: HostCopy


class StepAhead:
    """The pending step of one runner. It holds no reference to the runner (the runner passes itself to
    queue_next): a cycle between them would leave a runner, and its CUDA graphs, to the cyclic garbage collector,
    which may free them in the middle of another runner's graph capture, and a graph freed there breaks the
    capture."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.pending: PendingStep | None = None

    def queue_next(self, runner, items: list[StepItem], inputs: StepInputs, tokens: torch.Tensor) -> None:
        """Queues the decode step after the one whose tokens (on the device, [items]) are `tokens`: the same batch,
        fed those tokens, at the next position of every request (a decode chain of one step, writing the draft's
        context with the runner's DFLASH worker: every decode does, speculation off for a large batch)."""
        following = decode_chain(
            runner,
            runner.spec,
            inputs,
            [item.req.params for item in items],
            [item.req.generator for item in items],
            1,
            fed=tokens,
        )[0]
        self.pending = PendingStep(items, inputs, following, HostCopy.of(following))

    def take(self) -> PendingStep | None:
        pending, self.pending = self.pending, None
        return pending

    def drop(self) -> None:
        """Forgets the pending step once the device has run it (its tokens are not committed): then nothing queued
        touches memd's pools, and memd may free what it wrote."""
        pending = self.take()
        if pending is not None:
            pending.copy.wait()
