"""What the engine tests on the CPU share (a real memd and the default model): a small DFLASH draft whose context the
target's plain decodes write, the requests of a mixed workload, and waiting until the engine has handed memd back
everything it held."""

import time

from modeld.engine.loop import make_generator
from modeld.request import Request
from modeld.sampling_params import SamplingParams
from tests.daemons import is_idle
from tests.tiny_models import write_draft


def context_draft(folder, model):
    """A random 2-layer draft (block 4, window 64) for the default model."""
    return write_draft(folder, model, layers=2, block_size=4, target_layer_ids=(1, 15, 27), sliding_window=64)


def draft_settings(draft) -> dict:
    """ModeldConfig's DFLASH settings for `draft` (none without one), speculation off from 2 running requests: the
    target's plain decodes then write the draft's context."""
    if draft is None:
        return {}
    return dict(draft_model=str(draft), speculative_algorithm="dflash", speculative_disable_by_batch_size=2)


def mixed_requests(prompts: list[list[int]], lengths: list[int], device: str) -> list[Request]:
    """One request per prompt and length: greedy at odd indexes, sampled (temperature 0.8, top-p 0.95, seeded by
    its index) at even ones."""
    reqs = []
    for i, (ids, length) in enumerate(zip(prompts, lengths)):
        params = (
            SamplingParams(max_new_tokens=length, temperature=0)
            if i % 2
            else SamplingParams(max_new_tokens=length, temperature=0.8, top_p=0.95, seed=i)
        )
        reqs.append(
            Request(
                rid=f"r{i}",
                prompt_ids=list(ids),
                params=params,
                generator=None if params.greedy else make_generator(params.seed, device),
            )
        )
    return reqs


def wait_until_released(memd, engine, timeout: float = 10.0) -> None:
    """memd idle (MemdProcess.wait_idle), then the engine thread past the call that freed it: it drops its pending
    releases once they are sent, and the call sent ahead once memd's answer is applied (an idle pass's releases
    go without waiting: the next pass applies the answer)."""
    assert is_idle(memd.wait_idle(timeout))
    deadline, calls = time.monotonic() + timeout, engine.scheduler.memd
    while (calls.releases or calls.in_flight is not None) and time.monotonic() < deadline:
        time.sleep(0.01)
