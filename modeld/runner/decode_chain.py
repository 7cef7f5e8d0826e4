"""Several decode steps of one batch launched back to back, with one copy of their tokens to the host at the end:
the host's work per step (the tokens' copy and wait, commit, output, scheduling, packing) is paid once per k steps.
It serves the decode batches that the fused k-step graph (modeld.runner.graphs) does not: requests that sample, with
or without DFLASH's draft context (speculation off for a large batch), the CPU, and the one step modeld.runner.step_ahead
queues before the last one is committed. Each step runs the batch's one-step graph (or the eager forward), picks
its tokens on the device (the graph's argmax, or the sampler with each request's own generator, drawn in the same
order as one step at a time), writes the draft context, and moves the packed inputs on by one token on the device
(modeld.runner.step_advance); nothing in the chain waits for the device.

Invariant (modeld.runner.step_advance's): every request holds every position the k steps reach (ModelRunner.steps_ahead),
so each step's slots are in req_to_token before the chain starts."""

import torch

from modeld.runner.model_runner import ModelRunner, StepInputs
from modeld.runner.sampling import sample
from modeld.runner.step_advance import advance_inputs
from modeld.sampling_params import SamplingParams


def decode_chain(
    runner: ModelRunner,
    dflash,
    inputs: StepInputs,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
    k: int,
    fed: torch.Tensor | None = None,
) -> torch.Tensor:
    """k decode steps of the prepared batch (every item one token a step, params and generators per item): each
    step's token per item [k, items], on the device. With `fed` (tokens [items] on the device), the batch is first
    moved on by them: its steps follow one whose tokens are not committed yet (modeld.runner.step_ahead)."""
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
