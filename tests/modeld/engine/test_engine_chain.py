"""The engine's decode chains (ModelRunner.run -> modeld.runner.steps_ahead.decode_chain) on the CPU, through a real memd and the default
model. On the GPU, chains follow a graph's choice of steps; on the CPU steps always run one at a time, so here
the runner's choice is replaced by the same rule without graphs: up to 4 steps while every request holds the
slots. The same requests must then give the same tokens as one step at a time: greedy and seeded sampled ones,
some ending at EOS inside a chain (its later steps dropped), with and without a DFLASH draft's context (speculation
off while 2 or more run). memd ends idle: slots written past a request's end are freed with it."""

import pytest

from modeld.config import ModeldConfig
from modeld.engine.build import build_engine
from modeld.engine.hooks import EngineHooks
from tests.daemons import is_idle, memd_args, run_memd
from tests.modeld.engine.workloads import context_draft, draft_settings, mixed_requests


def chained_steps(items, inputs) -> int:
    """ModelRunner.steps_ahead's rule for a decode batch, without graphs: 1, or up to 4 held steps."""
    if len(items) < 2 or inputs.verify or any(item.num_tokens != 1 or item.req.pending != 1 for item in items):
        return 1
    spare = min(item.req.held - item.req.computed for item in items)
    return max([k for k in (2, 4) if k <= spare], default=1)


class StepsPerPass(EngineHooks):
    """The device steps each engine step ran, from what it committed (modeld.engine.hooks)."""

    def __init__(self):
        self.ran: list[int] = []

    def committed(self, results) -> None:
        self.ran.append(max(len(result.steps) for result in results))


def answers(memd, model, prompts: list[list[int]], chained: bool, draft) -> tuple[list[list[int]], int]:
    steps = StepsPerPass()
    built = build_engine(
        ModeldConfig(memd=memd.address, target_model=str(model), **draft_settings(draft)),
        lambda serving: None,
        hooks=steps,
    )
    engine = built.engine
    if chained:  # the hooks only observe: the CPU's choice of steps is replaced to make chains run at all
        steps_ahead = engine.runner.steps_ahead
        engine.runner.steps_ahead = lambda items, inputs: max(steps_ahead(items, inputs), chained_steps(items, inputs))
    reqs = mixed_requests(prompts, [24] * 4, "cpu")
    for r in reqs:
        assert engine.submit(r)
    engine.start()  # after every submit: the first step takes all of them, in both runs
    try:
        for r in reqs:
            while r.events.get(timeout=120)[0] != "complete":
                pass
    finally:
        engine.stop()
        built.link.close()
    assert all(r.finish.reason in ("stop", "length") for r in reqs), [r.finish for r in reqs]
    return [r.output_ids for r in reqs], max(steps.ran, default=1)


@pytest.mark.parametrize("with_draft", [False, True], ids=["plain", "draft-context"])
def test_chained_decode_steps_answer_as_single_steps(default_model, chat_ids, tmp_path, with_draft):
    draft = context_draft(tmp_path / "draft", default_model) if with_draft else None
    settings = dict(draft=draft, window=64) if draft else {}
    with run_memd(default_model, *memd_args(max_running=4, budget=60_000_000, chunk=512, **settings)) as memd:
        single, _ = answers(memd, default_model, chat_ids, False, draft)
        chained, most = answers(memd, default_model, chat_ids, True, draft)
        assert most == 4, "no chain of 4 steps ran"
        assert chained == single
        assert any(len(out) < 24 for out in single), "no request ended inside the run (at EOS)"
        assert is_idle(memd.wait_idle(10))
