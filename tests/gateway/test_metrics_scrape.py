"""Prometheus metrics of memd and both modelds (--metrics-port 0), parsed with prometheus_client's parser: the pool
gauges agree with Capacity, and the counters move as requests run."""

import re
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from modeld.engine.metrics import SNAPSHOT_INTERVAL_S
from protos import memd_pb2

ENDPOINT = re.compile(r"metrics on (http://\S+/metrics)")


def scrape(log_text: str) -> dict[tuple, float]:
    """Every sample of the endpoint a daemon logged, by (name, sorted labels)."""
    with urllib.request.urlopen(ENDPOINT.search(log_text).group(1), timeout=10) as reply:
        text = reply.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def settled(log_text: str) -> dict[tuple, float]:
    """scrape, once modeld's front holds a snapshot the engine took after what happened so far (it sends one every
    SNAPSHOT_INTERVAL_S)."""
    time.sleep(3 * SNAPSHOT_INTERVAL_S)
    return scrape(log_text)


def total(samples: dict, name: str, **labels) -> float:
    return sum(v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls))


def modeld_totals(stack, names: list[str]) -> dict[str, float]:
    samples = [settled(m.log_path.read_text()) for m in stack.modelds]
    return {name: sum(total(s, name) for s in samples) for name in names}


def test_counters_move_as_requests_run(stack, model_name, openai_client):
    names = [
        "modeld:request_success_total",
        "modeld:generation_tokens_total",
        "modeld:prompt_tokens_total",
        "modeld:time_to_first_token_seconds_count",
        "modeld:e2e_request_latency_seconds_count",
        "modeld:prefix_cache_hit_tokens_total",
    ]
    before = modeld_totals(stack, names)
    memd_before = scrape(stack.memd.log())
    messages = [{"role": "user", "content": "Metrics: say hello twice, politely."}]
    for _ in range(2):  # the second is served from memd's prefix cache
        reply = openai_client.chat.completions.create(model=model_name, messages=messages, max_tokens=8, temperature=0)
    after = modeld_totals(stack, names)
    assert after["modeld:request_success_total"] - before["modeld:request_success_total"] == 2
    assert after["modeld:generation_tokens_total"] - before["modeld:generation_tokens_total"] >= 2
    assert after["modeld:prompt_tokens_total"] - before["modeld:prompt_tokens_total"] == 2 * reply.usage.prompt_tokens
    assert after["modeld:time_to_first_token_seconds_count"] - before["modeld:time_to_first_token_seconds_count"] == 2
    assert after["modeld:e2e_request_latency_seconds_count"] - before["modeld:e2e_request_latency_seconds_count"] == 2
    assert (
        after["modeld:prefix_cache_hit_tokens_total"] - before["modeld:prefix_cache_hit_tokens_total"]
        == reply.usage.prompt_tokens_details.cached_tokens
        > 0
    )

    memd_after = scrape(stack.memd.log())
    for method in ("Alloc", "MatchPrefix"):
        count = ("memd:rpc_duration_seconds_count", (("method", method),))
        assert memd_after[count] > memd_before.get(count, 0), method
    assert modeld_totals(stack, ["modeld:step_duration_seconds_count"])["modeld:step_duration_seconds_count"] > 0
    for modeld in stack.modelds:
        samples = settled(modeld.log_path.read_text())
        for name in (
            "modeld:num_requests_running",
            "modeld:num_requests_waiting",
            "modeld:num_preemptions_total",
            "modeld:spec_decode_num_drafts_total",
            "modeld:spec_decode_num_accepted_tokens_total",
        ):
            assert (name, ()) in samples, name
        # an endpoint picker's KV usage, relayed from memd's Capacity at scrape time (the pool is memd's, shared)
        target = stack.memd.capacity().target
        assert samples[("modeld:kv_cache_tokens", (("state", "total"),))] == target.total == 8192
        used = samples[("modeld:kv_cache_tokens", (("state", "used"),))]
        assert 0 <= used <= target.total
        assert samples[("modeld:kv_cache_usage_perc", ())] == used / target.total


def test_memd_pool_gauges_and_error_counts(stack):
    capacity = stack.memd.capacity()
    samples = scrape(stack.memd.log())
    tokens = {
        state: samples[("memd:kv_cache_tokens", (("pool", "target"), ("state", state)))]
        for state in ("total", "free", "held", "evictable", "protected")
    }
    assert tokens["total"] == capacity.target.total == 8192
    assert tokens["free"] + tokens["held"] + tokens["evictable"] + tokens["protected"] == tokens["total"]
    assert samples[("memd:kv_cache_usage_perc", (("pool", "target"),))] == (8192 - tokens["free"]) / 8192
    assert samples[("memd:sessions", ())] == 2  # the two modelds
    errors = ("memd:rpc_errors_total", (("code", "NOT_FOUND"), ("method", "Free")))
    refused = samples.get(errors, 0)
    try:
        stack.memd.stub.Free(memd_pb2.FreeRequest(session_id="no-such-session"), timeout=5)
    except Exception:  # NOT_FOUND, counted
        pass
    assert scrape(stack.memd.log())[errors] == refused + 1
