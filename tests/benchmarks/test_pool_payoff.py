"""bench.memd.pool_payoff: its formula side and command line, and at CPU sizes the comparison itself (the default
model and its shipped draft through a real memd at ratio 1 and 0.25): memd sizes its pools as the formula does, the
bounded draft pool gives the target more tokens and one more request of a context fits at once, and the greedy
outputs do not change with the ratio. No timing is asserted."""

import argparse

import pytest

from bench.memd.pool_payoff import context_list, parse_args, ratio_list
from bench.memd.pool_report import measured_text, report
from bench.memd.pool_runs import Fit, LongRun, Probe, RatioRun, greedy_equal, measure_ratio
from bench.memd.pool_sizes import (
    PoolFigures,
    capacity_figures,
    formula_sizes,
    log_figures,
    memd_config,
    pool_flags,
    pool_holds,
    resolve_context,
)
from memd.plan import log_plan, make_plan
from tests.daemons import run_memd

# A pool small enough for the CPU: two request rows, and a request cap (chunk, lookahead, eviction interval) that
# lets ratio 0.25 start at 150 MB. pool/2 is half of ratio 0.25's target pool: two requests of it fit there, one at
# ratio 1, whose pool is about 9% smaller.
SMALL = [
    *("--device", "cpu", "--kv-budget-bytes", "150000000", "--draft-kv-ratio", "1,0.25"),
    *("--max-running-requests", "2", "--chunked-prefill-size", "128", "--decode-lookahead", "16"),
    *("--draft-eviction-interval", "0", "--contexts", "pool/2", "--fit-new-tokens", "64"),
    *("--long-requests", "2", "--long-prompt", "256", "--long-new-tokens", "8", "--chat-conversations", "0"),
]


@pytest.fixture(scope="module")
def small_args(default_model) -> argparse.Namespace:
    return parse_args([*SMALL, "--target", str(default_model)])


@pytest.fixture(scope="module")
def runs(default_model, small_args) -> dict[float, RatioRun]:
    """Each ratio against a strict memd of its own, which ends with its pools free (run_memd checks it again)."""
    measured = {}
    for ratio in small_args.draft_kv_ratio:
        with run_memd(default_model, *pool_flags(small_args, ratio), "--strict") as memd:
            measured[ratio] = measure_ratio(memd.address, ratio, small_args)
    return measured


# ---- the comparison at CPU sizes ----------------------------------------------------------------------------------


def test_memd_sizes_its_pools_as_the_formula_does(runs, small_args):
    for run in runs.values():
        assert abs(run.capacity.target_tokens - run.formula.target_tokens) <= small_args.page_size  # the goal
        assert run.capacity == run.formula == run.logged  # in fact exact, the bytes and the draft pool's too


def test_the_bounded_draft_pool_gives_the_target_more_tokens(runs):
    assert runs[0.25].capacity.target_tokens > runs[1.0].capacity.target_tokens
    assert runs[0.25].capacity.draft_tokens < runs[1.0].capacity.draft_tokens


def test_the_measured_most_at_once_is_the_formulas_and_grows_with_the_pool(runs):
    bounded, full = runs[0.25].fits[0], runs[1.0].fits[0]
    assert bounded.formula > full.formula, "the sizes compare nothing: both ratios fit as many"
    # measured: the formula's count ran at once unpreempted, and one more did not (or is past the rows)
    assert (bounded.measured, full.measured) == (bounded.formula, full.formula), (bounded.probes, full.probes)


def test_greedy_outputs_are_equal_across_ratios(runs, small_args):
    assert all(run.long.errors == () for run in runs.values())
    assert all(len(out) == small_args.long_new_tokens for out in runs[1.0].long.outputs)
    assert greedy_equal(list(runs.values()))


# ---- the formula side -----------------------------------------------------------------------------------------------


def test_the_formula_is_memds_plan_for_the_same_flags(small_args):
    for ratio in (1.0, 0.25, 0.5):
        cfg = memd_config(small_args, ratio)
        assert formula_sizes(cfg) == make_plan(cfg).sizes


def test_the_flags_reach_memd(small_args):
    cfg = memd_config(small_args, 0.25)
    assert (cfg.draft_kv_ratio, cfg.draft_window, cfg.kv_budget_bytes) == (0.25, 256, 150_000_000)
    assert (cfg.max_running_requests, cfg.chunked_prefill_size, cfg.decode_lookahead) == (2, 128, 16)
    assert (cfg.draft_eviction_interval, cfg.page_size, cfg.device) == (0, 16, "cpu")


def test_memds_log_lines_read_back_as_its_sizes(small_args, caplog):
    cfg = memd_config(small_args, 0.25)
    with caplog.at_level("INFO", logger="memd"):
        log_plan(make_plan(cfg))
    sizes = formula_sizes(cfg)
    target_bytes, draft_bytes = sizes.kv_bytes()
    assert log_figures(caplog.text) == PoolFigures(
        sizes.target_tokens, target_bytes, sizes.draft_tokens, draft_bytes, sizes.request_cap
    )
    assert log_figures("memd ready") is None


def test_capacity_reads_as_pool_figures():
    capacity = {"target": {"total": 4800, "bytes": 10}, "draft": {"total": 1200, "bytes": 2}, "request_cap": 1168}
    assert capacity_figures(capacity) == PoolFigures(4800, 10, 1200, 2, 1168)


@pytest.mark.parametrize(
    "tokens, context, holds",
    [
        (3120, 1553, 2),  # 1552 positions held: 97 pages each
        (3104, 1553, 2),  # exactly two
        (3088, 1553, 1),
        (3120, 1554, 1),  # a position more: a page more each
        (3120, 17, 195),
    ],
)
def test_the_pool_holds_each_requests_pages_but_its_last_positions(tokens, context, holds):
    assert pool_holds(tokens, context, page=16) == holds


def test_the_formulas_count_is_the_pools_within_the_rows():
    assert Fit(1553, pool_holds=5, rows=2, probes=()).formula == 2
    assert Fit(1553, pool_holds=1, rows=2, probes=()).formula == 1
    assert Fit(9000, pool_holds=None, rows=2, probes=()).formula is None


def test_a_pool_share_is_a_context_that_many_fit_and_no_more():
    context = resolve_context("pool/2", 3120, 16)
    assert context == 1552 and pool_holds(3120, context, 16) == 2
    assert resolve_context("pool/1", 3120, 16) == 3120 and pool_holds(3120, 3120, 16) == 1
    assert resolve_context("2048", 3120, 16) == 2048


# ---- the command line -----------------------------------------------------------------------------------------------


def test_ratios_and_contexts_parse():
    assert ratio_list("1,0.25,0.5") == [1.0, 0.25, 0.5]
    assert context_list("2048, pool/3,") == ["2048", "pool/3"]
    assert context_list("") == []


@pytest.mark.parametrize("text", ["1", "1,1", "0.25,0", "1,1.5", "1,a"])
def test_a_ratio_list_that_compares_nothing_or_is_out_of_range_is_refused(text):
    with pytest.raises(argparse.ArgumentTypeError):
        ratio_list(text)


@pytest.mark.parametrize("text", ["1", "pool/0", "pool/x", "2k"])
def test_a_context_that_is_neither_tokens_nor_a_pool_share_is_refused(text):
    with pytest.raises(argparse.ArgumentTypeError):
        context_list(text)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--draft", "none"], "needs a draft"),
        (["--kv-budget-bytes", "100000000"], "Use at least"),
        (["--fit-new-tokens", "2000"], "leaves no prompt"),
        (["--long-prompt", "8192"], "longer than memd's context length"),
        (["--chat-conversations", "2", "--chat-turns", "3", "--chat-turn-tokens", "900"], "chat's last turn"),
    ],
)
def test_a_run_that_could_not_compare_is_refused_before_it_starts(default_model, extra, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args([*SMALL, "--target", str(default_model), *extra])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


# ---- what the report says -------------------------------------------------------------------------------------------


def probe_of(requests: int, preemptions: int = 0, running: int | None = None) -> Probe:
    return Probe(requests, preemptions, requests if running is None else running, 1000 * requests, 0)


@pytest.mark.parametrize(
    "probes, rows, measured, text",
    [
        ((probe_of(2), probe_of(3, preemptions=1)), 8, 2, "2"),
        ((probe_of(2), probe_of(3, running=2)), 8, 2, "2"),  # the third waited for room
        ((probe_of(2),), 2, 2, "2"),  # one more is past the rows
        ((probe_of(2), probe_of(3)), 8, None, ">= 3"),
        ((probe_of(2, preemptions=1), probe_of(3, preemptions=2)), 8, None, "< 2"),
    ],
)
def test_a_fit_is_measured_when_its_count_ran_at_once_and_one_more_did_not(probes, rows, measured, text):
    fit = Fit(context=1553, pool_holds=2, rows=rows, probes=probes)
    assert fit.measured == measured and measured_text(fit) == text


def ratio_run(ratio: float, target_tokens: int, outputs, errors=()) -> RatioRun:
    pools = PoolFigures(target_tokens, 100 * target_tokens, target_tokens // 4, 10, 752)
    fits = (Fit(1553, 2, 2, (probe_of(2),)), Fit(17, 195, 2, (probe_of(2),)))
    return RatioRun(ratio, pools, pools, None, fits, LongRun(16, 2.0, 1, errors, outputs), None)


def test_the_report_names_the_device_the_figures_sources_and_whether_outputs_agree(small_args):
    exhausted = "RESOURCE_EXHAUSTED: the request needs 900 tokens of KV and the pool cannot hold them"
    runs = [ratio_run(1.0, 2848, ((1, 2),)), ratio_run(0.25, 3120, ((1, 3),), (exhausted, exhausted))]
    text = report(runs, small_args)
    assert text.startswith("CPU (")
    assert "| 0.25 | formula | 3,120 | 312,000 | 780 | 10 | 752 | +9.6% |" in text
    assert "| 0.25 | memd log (measured): no sizing lines |" in text
    assert "| 1,553 | 0.25 | 2 | 2 | 2: 0 preempted, 2 ran at once, 2,000 KV tokens at most; 3: past the rows |" in text
    assert "| 17 | 1 | 2 (the rows) | 2 |" in text
    assert "| 1 | 8.0 | +0.0% | 2.00 | 1 | 0 |" in text and "| 0.25 | 8.0 | +0.0% | 2.00 | 1 | 2 |" in text
    assert f"- ratio 0.25: 2 failed with {exhausted}" in text
    assert text.endswith("greedy outputs equal across ratios: no")
    assert not greedy_equal(runs) and greedy_equal(runs[:1] * 2)
