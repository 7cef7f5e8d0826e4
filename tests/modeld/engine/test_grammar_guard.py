"""A constrained request whose grammar takes too long to mask a step ends with RESOURCE_EXHAUSTED, saying so, while
the requests beside it finish as usual and memd holds nothing afterwards; a constraint that does not compile ends
its request with INVALID_ARGUMENT before it takes any slot. On the CPU, an in-process engine on a real memd and the
default model; the mask's bound is lowered to 0 for the slow case (every mask then takes too long)."""

import pytest

from modeld.config import ModeldConfig
from modeld.engine.build import build_engine
from modeld.grammar import matcher
from modeld.request import Request
from modeld.sampling_params import Constraint, SamplingParams
from tests.daemons import memd_args, run_memd
from tests.modeld.engine.workloads import wait_until_released


@pytest.fixture
def engine(default_model):
    with run_memd(default_model, *memd_args(max_running=3, budget=60_000_000, chunk=512)) as memd:
        built = build_engine(ModeldConfig(memd=memd.address, target_model=str(default_model)), lambda serving: None)
        built.engine.start()
        try:
            yield built.engine, memd
        finally:
            built.engine.stop()
            built.link.close()


def run(engine, requests: list[Request]) -> None:
    for req in requests:
        assert engine.submit(req)
    for req in requests:
        while req.events.get(timeout=120)[0] != "complete":
            pass


def test_a_grammar_too_slow_to_mask_ends_its_request_alone(engine, chat_ids, monkeypatch):
    engine, memd = engine
    monkeypatch.setattr(matcher, "MAX_MASK_SECONDS", 0.0)
    slow = Request(
        "slow",
        list(chat_ids[0]),
        SamplingParams(max_new_tokens=16, temperature=0, constraint=Constraint("json_object")),
    )
    plain = Request("plain", list(chat_ids[1]), SamplingParams(max_new_tokens=16, temperature=0, ignore_eos=True))
    run(engine, [slow, plain])
    assert slow.finish.error_code == "RESOURCE_EXHAUSTED" and "to mask one step" in slow.finish.error
    assert len(slow.output_ids) == 1, "the request went on after its first slow step"
    assert plain.finish.reason == "length" and len(plain.output_ids) == 16
    wait_until_released(memd, engine)


def test_a_constraint_that_does_not_compile_takes_no_slot(engine, chat_ids):
    engine, memd = engine
    bad = Request("bad", list(chat_ids[0]), SamplingParams(max_new_tokens=8, constraint=Constraint("regex", "(a")))
    run(engine, [bad])
    assert bad.finish.error_code == "INVALID_ARGUMENT" and "does not compile" in bad.finish.error
    assert bad.in_memd is False and bad.computed == 0 and bad.slots == []
    cap = memd.capacity()
    assert cap.target.held_by_requests == 0 and cap.target.free == cap.target.total, cap
