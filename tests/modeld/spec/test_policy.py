"""The speculation policy (modeld.spec.policy) against a modelled engine: step costs and acceptance it is told, the
decisions it makes, how often it explores, and that it learns each bucket and kind of batch apart."""

import pytest

from modeld.request import Request
from modeld.sampling_params import SamplingParams
from modeld.spec.policy import (
    BURST,
    EXPLORATION_SHARE,
    MIN_SAMPLES,
    REEXPLORE_FROM,
    REEXPLORE_MAX,
    SpeculationPolicy,
    bucket_of,
)


def requests(n: int, sampled: int = 0) -> list[Request]:
    return [
        Request(f"r{i}", [1, 2, 3], SamplingParams(max_new_tokens=8, temperature=0.8 if i < sampled else 0))
        for i in range(n)
    ]


def serve(policy: SpeculationPolicy, running, passes: int, verify_s: float, plain_s: float, accept: int) -> list[bool]:
    """`passes` decode passes of one step each, as the engine reports them: the option the policy chose, its cost,
    and (verify) each request's committed tokens."""
    chosen = []
    for _ in range(passes):
        verify = policy.speculate(running)
        assert policy.speculate(running) == verify  # asked twice (plan, then the pending step's check): one answer
        if verify:
            for req in running:
                policy.accepted(req, [accept])
        policy.observe(running, verify, verify_s if verify else plain_s, steps=1)
        chosen.append(verify)
    return chosen


def test_buckets_are_powers_of_two():
    assert [bucket_of(n) for n in (1, 2, 3, 4, 5, 16, 17, 64)] == [1, 2, 4, 4, 8, 16, 32, 64]


def test_the_first_verify_teaches_acceptance_then_a_bucket_measures_plain_first():
    """Nothing known: one verify step (the acceptance). Then the bucket runs plain until it has MIN_SAMPLES samples
    (the first pass after a switch is none), and verifies next where even the bound of its cost lets it win."""
    policy, running = SpeculationPolicy(), requests(1)
    chosen = serve(policy, running, MIN_SAMPLES + 6, verify_s=1.5, plain_s=1.0, accept=4)
    assert chosen[: MIN_SAMPLES + 3] == [True] + [False] * (MIN_SAMPLES + 1) + [True]
    assert policy.costs[(1, False)].seconds[False].count == MIN_SAMPLES


def test_a_draft_that_accepts_nothing_never_verifies_a_larger_batch_to_learn_it():
    """Measured at batch 1 (verify 1.5x a plain step, one token a verify), a batch of 4 cannot win by verifying even
    at that ratio: it decodes plainly from its first step, and verifies only in rare explorations."""
    policy = SpeculationPolicy()
    serve(policy, requests(1), 40, verify_s=1.5, plain_s=1.0, accept=1)
    chosen = serve(policy, requests(4), 2000, verify_s=3.0, plain_s=1.0, accept=1)
    assert chosen[:REEXPLORE_FROM] == [False] * REEXPLORE_FROM
    assert chosen.count(True) / len(chosen) < 0.005  # a few bursts, ever further apart


@pytest.mark.parametrize(
    "verify_s, accept, verifies",
    [(2.0, 3, True), (2.0, 1, False), (4.0, 3, False), (1.05, 2, True)],
)
def test_it_chooses_the_option_with_more_tokens_a_second(verify_s, accept, verifies):
    """Verify when accept / verify cost beats 1 / plain cost (a plain step costs 1 here)."""
    policy, running = SpeculationPolicy(), requests(2)
    serve(policy, running, 2 * (MIN_SAMPLES + 1) + 8, verify_s=verify_s, plain_s=1.0, accept=accept)
    assert policy.speculate(running) is verifies


@pytest.mark.parametrize("strong", [True, False])
def test_the_losing_option_costs_a_few_passes_in_a_thousand(strong):
    """A strong draft (accept 6 at 1.2x a plain step) verifies almost always; a weak one (accept 1.5 at 3x) almost
    never: after the warm-up, explorations of the loser grow rarer (the interval doubles while they confirm)."""
    policy, running = SpeculationPolicy(), requests(1)
    verify_s, accept = (1.2, 6) if strong else (3.0, 1)
    chosen = serve(policy, running, 4000, verify_s=verify_s, plain_s=1.0, accept=accept)
    after_warm_up = chosen[2 * (MIN_SAMPLES + 1) :]
    losing = after_warm_up.count(not strong) / len(after_warm_up)
    assert losing < 0.02, f"the losing option ran {losing:.1%} of the passes"
    assert policy.costs[(1, False)].interval == REEXPLORE_MAX


def test_an_exploration_that_flips_the_choice_restarts_the_interval():
    """Verify wins until its cost rises above its acceptance's worth: the next burst of plain steps measures plain
    anew, the choice flips, and the interval starts over."""
    policy, running = SpeculationPolicy(), requests(1)
    serve(policy, running, 200, verify_s=1.5, plain_s=1.0, accept=3)
    bucket = policy.costs[(1, False)]
    assert policy.speculate(running) and bucket.interval > REEXPLORE_FROM
    chosen = serve(policy, running, 2 * REEXPLORE_MAX, verify_s=5.0, plain_s=1.0, accept=3)
    assert not policy.speculate(running)
    assert chosen[-100:].count(True) <= BURST


def test_a_request_s_own_acceptance_outweighs_the_global_mean_as_it_grows():
    policy = SpeculationPolicy()
    good, new = requests(2)
    policy.accepted(requests(3)[2], [1] * 50)  # the global mean starts low
    assert policy.expected_tokens(new) == pytest.approx(1.0)
    policy.accepted(good, [9])
    one = policy.expected_tokens(good)
    policy.accepted(good, [9] * 20)
    assert 1 < one < policy.expected_tokens(good) < 9
    policy.forget(good)
    assert policy.expected_tokens(good) == pytest.approx(policy.accept.value)


def test_greedy_and_sampled_batches_are_measured_apart():
    """A batch with a sampled request is another kind of step (fewer tokens accepted, one verify a replay): its
    costs never mix with the greedy batch's of the same size."""
    policy = SpeculationPolicy()
    greedy, mixed = requests(2), requests(2, sampled=1)
    serve(policy, greedy, 20, verify_s=1.5, plain_s=1.0, accept=4)
    serve(policy, mixed, 20, verify_s=3.0, plain_s=1.0, accept=2)
    assert policy.speculate(greedy) and not policy.speculate(mixed)
    assert policy.costs[(2, False)].seconds[True].value == pytest.approx(1.5)
    assert policy.costs[(2, True)].seconds[True].value == pytest.approx(3.0)


def test_several_steps_a_pass_count_as_steps_and_costs_reset_after_a_re_attach():
    policy, running = SpeculationPolicy(), requests(1)
    for _ in range(MIN_SAMPLES + 1):
        policy.observe(running, True, 4.0, steps=4)
    assert policy.costs[(1, False)].seconds[True].value == pytest.approx(1.0)
    policy.reset_costs()
    assert not policy.costs and policy.speculate(running)


def test_a_far_worse_option_is_explored_at_once_rarely():
    """One burst of a verify step that costs 4 plain steps for one token (a weak draft on the CPU) loses
    BURST * 3 plain steps: the interval stretches at once until that is EXPLORATION_SHARE of the time, not by
    doubling."""
    policy, running = SpeculationPolicy(), requests(1)
    serve(policy, running, 2 * (MIN_SAMPLES + 1) + REEXPLORE_FROM + BURST, verify_s=4.0, plain_s=1.0, accept=1)
    assert policy.costs[(1, False)].interval == round(BURST * 3 / EXPLORATION_SHARE)


def test_a_sampled_batch_takes_the_greedy_cost_ratio_of_its_size_as_its_bound():
    """Greedy batches of 4 measured verify at 3x a plain step: a batch of 4 with a sampled request, whose verify
    steps cost at least that, decodes plainly from its first step when its expected tokens cannot beat 3x."""
    policy = SpeculationPolicy()
    serve(policy, requests(4), 40, verify_s=3.0, plain_s=1.0, accept=2)
    chosen = serve(policy, requests(4, sampled=1), REEXPLORE_FROM, verify_s=4.0, plain_s=1.0, accept=2)
    assert chosen == [False] * REEXPLORE_FROM
