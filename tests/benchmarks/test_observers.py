"""The observers bench's engine benchmarks attach to an engine's hooks (bench.engine.step_breakdown's Breakdown,
bench.memd.waits' Waits, bench.engine.host_overhead's ModelTime) on a real engine on the CPU, against a real memd
whose metrics count the calls it answered: each records the steps the engine ran and the memd calls it made as
memd counted them, and memd ends idle."""

import collections
from dataclasses import dataclass

import pytest

from bench.common.engine_hooks import SwitchableHooks
from bench.common.in_process import running_engine
from bench.common.metrics_scrape import metric_samples
from bench.common.requests import generate_all
from bench.engine.host_overhead import ModelTime
from bench.engine.step_breakdown import Breakdown
from bench.memd.waits import HandlerTimes, Waits
from modeld.config import ModeldConfig
from tests.daemons import memd_args, run_memd
from tests.modeld.engine.workloads import wait_until_released

# more tokens than memd grants ahead (its decode lookahead): the requests' top-ups call memd while they decode
REQUESTS, NEW_TOKENS, LOOKAHEAD = 3, 16, 4


@dataclass
class Served:
    memd: object
    engine: object
    hooks: SwitchableHooks
    prompts: list[list[int]]


@pytest.fixture(scope="module")
def served(default_model, chat_ids):
    """An engine built once with switchable hooks, each test attaching its observer for one run."""
    args = memd_args(max_running=4, budget=60_000_000, chunk=512, lookahead=LOOKAHEAD) + ["--metrics-port", "0"]
    with run_memd(default_model, *args) as memd:
        hooks = SwitchableHooks()
        with running_engine(ModeldConfig(memd=memd.address, target_model=str(default_model)), hooks) as engine:
            yield Served(memd, engine, hooks, chat_ids[:REQUESTS])


def memd_answered(memd) -> collections.Counter:
    """The calls memd answered so far, by method (its Calls stream counts each under its own method)."""
    calls = collections.Counter()
    for sample in metric_samples(memd.log(), "memd"):
        if sample.name == "memd:rpc_duration_seconds_count":
            calls[sample.labels["method"]] += int(sample.value)
    return calls


def run(served: Served, tag: str) -> collections.Counter:
    """REQUESTS greedy requests at once, to completion and until the engine has handed memd back what they held;
    the Alloc, Free, MatchPrefix and MatchPrefixBatch calls memd answered meanwhile."""
    before = memd_answered(served.memd)
    tokens, _, _ = generate_all(served.engine, served.prompts, NEW_TOKENS, True, tag)
    assert tokens == REQUESTS * NEW_TOKENS
    wait_until_released(served.memd, served.engine)
    answered = memd_answered(served.memd) - before
    return collections.Counter({m: answered[m] for m in ("Alloc", "Free", "MatchPrefix", "MatchPrefixBatch")})


def test_breakdown_times_the_forward_and_sampling_of_every_step_inside_its_step(served):
    breakdown = Breakdown(served.hooks)
    answered = run(served, "breakdown")
    row = breakdown.close()
    # one token a request a step (no chains on the CPU), the first from the prompt's step
    assert NEW_TOKENS <= breakdown.steps <= REQUESTS * NEW_TOKENS
    assert row["forward"] > 0 and row["sampling"] > 0 and row["draft"] == 0
    assert row["host"] > 0 and row["step"] > row["forward"] + row["sampling"] + row["memd"]
    assert 0 < breakdown.memd_calls <= sum(answered.values())
    assert row["memd_calls_per_100_steps"] == pytest.approx(100 * breakdown.memd_calls / breakdown.steps)


def test_waits_counts_every_match_and_free_memd_answered_and_the_allocs_waited_for(served):
    waits, handlers = Waits(served.hooks), HandlerTimes(served.memd.address)
    answered = run(served, "waits")
    rows = waits.close(handlers.since_start())
    counts = {kind: len(times) for kind, times in waits.times.items()}
    assert (
        counts.get("MatchPrefix", 0) + counts.get("MatchPrefixBatch", 0)
        == (answered["MatchPrefix"] + answered["MatchPrefixBatch"])
        > 0
    )
    assert counts.get("Free", 0) == answered["Free"]
    assert counts.get("Alloc", 0) <= answered["Alloc"]  # the rest were sent ahead
    assert NEW_TOKENS <= waits.steps <= REQUESTS * NEW_TOKENS
    assert len(rows) == len(counts) and not [row for row in rows if row.endswith("| -")]  # memd's handler time


def test_model_time_counts_every_memd_call_made_and_every_request_step(served):
    timing = ModelTime(served.hooks)
    answered = run(served, "model")
    steps, wall_ms, model_ms, host_ms, host_us, memd_calls = timing.close()
    assert memd_calls == sum(answered.values())
    assert timing.items == REQUESTS * NEW_TOKENS  # each request-step committed one token
    assert NEW_TOKENS <= steps <= REQUESTS * NEW_TOKENS
    assert 0 < model_ms < wall_ms and host_ms > 0 and host_us > 0
