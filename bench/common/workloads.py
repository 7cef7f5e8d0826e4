"""Greedy workloads of random prompts on an in-process engine (bench.common.in_process), what a run of them shows
(the most requests running at once, the positions they had computed), and memd's pools handed back at the end.

Prompts are random token ids drawn from a seed made of their name: prompts of one name are the same in every
configuration (so their greedy outputs can be compared), and prompts of two names share no cached prefix (their
first pages differ, but with the odds of a 32-bit hash collision)."""

import time
import zlib

import torch

from client.memd_admin import all_free, capacity_reply, flush_cache, is_idle
from modeld.engine.hooks import EngineHooks
from modeld.request import Request
from modeld.sampling_params import SamplingParams
from protos import memd_pb2

FIRST_ID = 100  # below it the special tokens of most vocabularies (BOS, EOS, chat markers)
COMPLETION_TIMEOUT = 600.0  # seconds one request may take once the one before it in the batch completed


def random_prompts(count: int, length: int, vocab: int, name: str) -> list[list[int]]:
    """`count` prompts of `length` token ids in [FIRST_ID, vocab), the same for the same name."""
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    return torch.randint(FIRST_ID, vocab, (count, length), generator=gen).tolist()


def greedy_requests(prompts: list[list[int]], new_tokens: int, tag: str) -> list[Request]:
    """One greedy request per prompt that decodes exactly `new_tokens` (EOS ignored), ids `tag`-0, `tag`-1, ...;
    not streamed: the engine queues only their completion (their first-token time is still recorded)."""
    params = SamplingParams(max_new_tokens=new_tokens, temperature=0, ignore_eos=True)
    return [Request(rid=f"{tag}-{i}", prompt_ids=list(p), params=params, stream=False) for i, p in enumerate(prompts)]


def run_requests(engine, reqs: list[Request]) -> float:
    """Submits every request at once; the seconds until the last completed (finished or failed)."""
    begin = time.perf_counter()
    for r in reqs:
        r.arrived = begin  # time to first token counts from the submission
        if not engine.submit(r):
            raise RuntimeError(f"a request {r.rid} is still running: give each workload its own tag")
    for r in reqs:
        while r.events.get(timeout=COMPLETION_TIMEOUT)[0] != "complete":
            pass
    return time.perf_counter() - begin


def errors(reqs: list[Request]) -> list[str]:
    """Why each request the engine aborted failed (a pool that could not hold it even alone, say)."""
    return [f"{r.finish.error_code}: {r.finish.error}" for r in reqs if r.finish.reason == "abort"]


class RunningPeak(EngineHooks):
    """The most requests running at once and the most positions they had computed together, seen after each step's
    commit (on the engine thread, where the scheduler's running list is not changing)."""

    def __init__(self, scheduler):
        self.scheduler = scheduler
        self.requests = 0
        self.tokens = 0

    def committed(self, results) -> None:
        running = self.scheduler.running
        self.requests = max(self.requests, len(running))
        self.tokens = max(self.tokens, sum(r.computed for r in running))


def wait_for(address: str, condition, timeout: float) -> memd_pb2.CapacityResponse:
    """memd's Capacity once `condition` holds of it; RuntimeError with the last answer after `timeout` seconds
    (an engine's releases reach memd on its next call, asynchronously)."""
    deadline = time.monotonic() + timeout
    while True:
        capacity = capacity_reply(address)
        if condition(capacity):
            return capacity
        if time.monotonic() > deadline:
            raise RuntimeError(f"memd at {address} is not {condition.__name__} after {timeout:g} s: {capacity}")
        time.sleep(0.01)


def release_all(address: str, timeout: float = 10.0) -> None:
    """With the engine still attached (closing its session would free what it held and hide a leak): memd idle,
    then its prefix cache flushed and both pools wholly free; RuntimeError otherwise."""
    wait_for(address, is_idle, timeout)
    flush_cache(address)
    wait_for(address, all_free, timeout)
