"""How `python -m client` prints results: tables and one-line summaries for people, JSON for tools."""

import dataclasses
import json

from client.messages import Chunk, GenerateResult


def print_capacity(cap: dict) -> None:
    """memd's pools as a table, then its sizing and request counts."""
    pools = [("target", cap["target"])] + ([("draft", cap["draft"])] if cap["has_draft"] else [])
    print(
        f"{'pool':<8}{'total':>10}{'free':>10}{'used':>10}{'held':>10}{'evictable':>11}{'protected':>11}{'bytes':>14}"
    )
    for name, p in pools:
        print(
            f"{name:<8}{p['total']:>10}{p['free']:>10}{p['used']:>10}{p['held_by_requests']:>10}"
            f"{p['evictable']:>11}{p['protected']:>11}{p['bytes']:>14}"
        )
    ranks = cap.get("tensor_parallel_size") or 1
    if ranks > 1:  # the slots are the same on every rank; bytes above are every rank's together
        print(f"tensor-parallel ranks={ranks}: each holds every slot over 1/{ranks} of the KV heads")
    print(
        f"ratio={cap['draft_kv_ratio']} window={cap['draft_window']} page_size={cap['page_size']} "
        f"request_cap={cap['request_cap']} running={cap['running_requests']}/{cap['max_running_requests']} "
        f"sessions={cap['sessions']}"
    )
    for held in cap["session_holdings"]:
        model = f"model {held['model_digest']}" if held["model_digest"] else "no model identity"
        print(
            f"  {held['label']} ({held['client_name']}, {model}): target {held['target_held']} "
            f"draft {held['draft_held']} tokens held"
        )


def print_modeld_capacity(cap: dict) -> None:
    """modeld's Capacity: memd's table, then modeld's own queue."""
    print_capacity(cap["memd"])
    print(f"modeld running={cap['running_requests']} waiting={cap['waiting_requests']}")


def print_flushed(freed: dict) -> None:
    """FlushCache's answer: tokens the prefix cache gave back per pool."""
    print(f"flushed prefix cache: target_freed={freed['target_freed']} draft_freed={freed['draft_freed']}")


def meta_line(result: GenerateResult) -> str:
    """One line with a result's finish reason, token counts and speculation figures."""
    stop = f" matched_stop={result.matched_stop!r}" if result.matched_stop else ""
    return (
        f"[finish={result.finish_reason}{stop} prompt={result.prompt_tokens} "
        f"completion={result.completion_tokens} cached={result.cached_tokens} "
        f"verify={result.spec_verify_ct} accept_length={result.spec_accept_length:.2f} id={result.request_id}]"
    )


def print_json(item: Chunk | GenerateResult) -> None:
    """A Chunk or GenerateResult as one line of JSON."""
    print(json.dumps(dataclasses.asdict(item)), flush=True)


def print_chunk_text(chunk: Chunk) -> None:
    """A chunk's text as it arrives, without a line break."""
    print(chunk.text, end="", flush=True)
