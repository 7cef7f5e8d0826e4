"""A decode step queued before the step before it is committed (modeld.runner.steps_ahead; on CUDA by default).

The scheduler's side (Scheduler.continues) through the scheduler tests' simulator over a real memd allocator: a
step it lets the engine queue ahead is one the scheduler would have planned itself, the same requests one token
further, with no memd call of any kind. The engine's side on the CPU, through a real memd and the default model:
the same requests give the same tokens with steps queued ahead as without, greedy and seeded sampled ones, with
and without a DFLASH draft's context writes; requests that end at EOS or at their length while a step for them is
queued, and one aborted while running, leave nothing behind: memd ends idle and the engine holds no request."""

import pytest

from modeld.config import ModeldConfig
from modeld.engine.build import build_engine
from modeld.engine.hooks import EngineHooks
from modeld.engine.tuning import Tuning
from tests.daemons import memd_args, run_memd
from tests.modeld.engine.test_scheduler import Sim, expected_outputs
from tests.modeld.engine.workloads import context_draft, draft_settings, mixed_requests, wait_until_released


def test_a_step_the_scheduler_lets_run_ahead_is_the_one_it_would_plan_with_no_memd_call():
    sim = Sim(pages=256, max_running=3, chunk=16, context=96, lookahead=16, async_top_ups=True)
    lengths = {"r0": 40, "r1": 25, "r2": 30, "r3": 20}  # r3 waits until one of the first three finishes
    for rid, max_new in lengths.items():
        sim.request(rid, 6, max_new=max_new)
    next_step, decided, checked = sim.sched.next_step, [], []

    def planned():
        calls = len(sim.session.calls) + len(sim.session.matches)
        items, hopeless = next_step()
        if decided and decided[-1][0] and not set(decided[-1][1]) & set(sim.done):
            # the step before let this one run ahead, and none of its requests ended there (the engine then drops
            # the step ahead): it is what the scheduler planned
            ahead_of = decided[-1][1]
            assert len(sim.session.calls) + len(sim.session.matches) == calls, "a step run ahead called memd"
            assert [item.req.rid for item in items] == ahead_of and not hopeless
            assert all(item.num_tokens == 1 and not item.verify for item in items)
            checked.append(ahead_of)
        decided.append((sim.sched.continues(items), [item.req.rid for item in items], bool(sim.sched.waiting)))
        return items, hopeless

    sim.sched.next_step = planned
    sim.run()
    assert len(checked) >= 10, f"only {len(checked)} steps could run ahead (none while r3 waits)"
    assert not any(ok for ok, _, waiting in decided if waiting), "a step ran ahead while a request waited"
    assert any(not ok for ok, rids, waiting in decided if not waiting and len(rids) == 3), (
        "no top-up came due (half the lookahead) and stopped a run of steps ahead"
    )
    assert {rid: r.output_ids for rid, r in sim.done.items()} == {
        rid: expected_outputs(n) for rid, n in lengths.items()
    }
    sim.assert_all_free()


def test_a_dflash_batch_that_speculates_never_runs_ahead():
    sim = Sim(
        pages=128,
        draft_pages=64,
        max_running=2,
        chunk=32,
        context=96,
        block=4,
        window=16,
        lookahead=8,
        async_top_ups=True,
    )
    for i in range(2):
        sim.request(f"r{i}", 6, max_new=30)
    next_step, decided = sim.sched.next_step, []

    def planned():
        items, hopeless = next_step()
        decided.append(sim.sched.continues(items))
        return items, hopeless

    sim.sched.next_step = planned
    sim.run()
    assert decided and not any(decided)
    sim.assert_all_free()


class StepsAhead(EngineHooks):
    """Counts the decode steps queued ahead (a "forward" that leaves a step pending: the runner took the one before
    at "plan"), those finished (a pass that took a pending step and committed its items) and those that dropped a
    request's token (fewer items committed than the pending step ran), from the engine's hooks."""

    def __init__(self):
        self.ahead = None  # the engine's StepAhead, once built
        self.queued = self.finished = self.dropped = 0
        self.pending_before = self.taken = None

    def enter(self, phase: str) -> None:
        if phase == "plan":
            self.taken = self.ahead.pending  # the pass takes it now
        elif phase == "forward":
            self.pending_before = self.ahead.pending

    def leave(self, phase: str) -> None:
        if phase == "forward" and self.ahead.pending is not None and self.ahead.pending is not self.pending_before:
            self.queued += 1

    def committed(self, results) -> None:
        if self.taken is not None:
            self.finished += 1
            self.dropped += len(results) < len(self.taken.items)


def answers(
    memd,
    model,
    prompts,
    overlap: bool,
    draft,
    abort_running: bool = False,
    device: str = "cpu",
    lengths=(12, 18, 24, 30),
):
    """Requests of these lengths (greedy and seeded sampled in turn) through an engine; with abort_running, the
    first is aborted once it has streamed a token. Returns the requests, how many steps were queued ahead, how many
    of those dropped a request's token (it ended at the step before) and how many dropped every token."""
    steps = StepsAhead()
    built = build_engine(
        ModeldConfig(
            device=device,
            memd=memd.address,
            target_model=str(model),
            tuning=Tuning(overlap_decode=overlap),
            **draft_settings(draft),
        ),
        lambda serving: None,
        hooks=steps,
    )
    engine = built.engine
    ahead = steps.ahead = engine.runner.ahead
    failures, fail_all = [], engine._fail_all  # a step that raised past its own handler (before the stop's)

    def recorded_failure(code, message, memd_alive):
        failures.append(message)
        return fail_all(code, message, memd_alive)

    engine._fail_all = recorded_failure
    reqs = mixed_requests(prompts, lengths, device)
    for r in reqs:
        assert engine.submit(r)
    engine.start()  # after every submit: the first step takes all of them, in both runs
    try:
        if abort_running:
            while reqs[0].events.get(timeout=120)[0] != "chunk":
                pass
            engine.abort("r0")
        for r in reqs:
            while r.events.get(timeout=120)[0] != "complete":
                pass
        wait_until_released(memd, engine)
        assert engine.requests == {} and engine.live == {} and ahead.pending is None and not failures
        assert engine.scheduler.running == [] and engine.scheduler.memd.releases == []
    finally:
        engine.stop()
        built.link.close()
    return reqs, steps.queued, steps.dropped, steps.queued - steps.finished


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("with_draft", [False, True], ids=["plain", "draft-context"])
def test_steps_queued_ahead_answer_as_steps_one_at_a_time(default_model, chat_ids, tmp_path, with_draft, device):
    """On the GPU with CUDA graphs (bf16): the step ahead's tokens are copied out before the next replay writes the
    graph's buffers, and its inputs are moved on by the device; the same batches give the same tokens exactly."""
    draft = context_draft(tmp_path / "draft", default_model) if with_draft else None
    settings = dict(draft=draft, window=64) if draft else {}
    args = memd_args(max_running=4, budget=60_000_000, chunk=512, **settings)
    if device == "cuda":
        args += ["--kv-cache-dtype", "bfloat16"]
    with run_memd(default_model, *args, device=device) as memd:
        alone, *_ = answers(memd, default_model, chat_ids, False, draft, device=device)
        ahead, queued, dropped, _ = answers(memd, default_model, chat_ids, True, draft, device=device)
        assert queued > 10, f"only {queued} steps were queued ahead"
        assert dropped, "no request ended while a step for it was queued"
        assert [r.output_ids for r in ahead] == [r.output_ids for r in alone]
        assert [r.finish.reason for r in ahead] == [r.finish.reason for r in alone]
        assert all(r.finish.reason in ("stop", "length") for r in ahead)


def test_a_request_aborted_while_a_step_is_queued_leaves_the_others_as_they_were(default_model, chat_ids):
    with run_memd(default_model, *memd_args(max_running=4, budget=60_000_000, chunk=512)) as memd:
        alone, *_ = answers(memd, default_model, chat_ids, False, None)
        ahead, queued, *_ = answers(memd, default_model, chat_ids, True, None, abort_running=True)
    assert queued
    assert all(r.finish.reason in ("stop", "length") for r in ahead[1:])
    assert ahead[0].finish.reason == "abort" or ahead[0].output_ids == alone[0].output_ids  # it may end first
    assert [r.output_ids for r in ahead[1:]] == [r.output_ids for r in alone[1:]]


def test_a_step_queued_for_a_request_that_ended_is_dropped_whole(default_model, chat_ids):
    """A lone request's last step queues the next (its prompt's grant holds 30 positions beyond it): the request
    ends there, so the step ahead has no request left; its tokens are dropped and nothing fails."""
    with run_memd(default_model, *memd_args(max_running=4, budget=60_000_000, chunk=512)) as memd:
        alone, *_ = answers(memd, default_model, chat_ids, False, None, lengths=(9,))
        ahead, queued, _, emptied = answers(memd, default_model, chat_ids, True, None, lengths=(9,))
    assert queued and emptied == 1
    assert ahead[0].output_ids == alone[0].output_ids and ahead[0].finish.reason == alone[0].finish.reason
