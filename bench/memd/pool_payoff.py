"""What the bounded draft pool buys at one KV budget: the same target and draft against a memd at each
--draft-kv-ratio, side by side in one run.

    python -m bench.memd.pool_payoff --kv-budget-bytes B [--draft-kv-ratio 1,0.25,0.5] [--device cuda|cpu]
        [--target DIR] [--load-format dummy] [--draft DIR] [--draft-window W] [--page-size 16]
        [--max-running-requests 64] [--chunked-prefill-size C] [--decode-lookahead L] [--draft-eviction-interval I]
        [--contexts 2048,8192,32768] [--fit-new-tokens 128] [--long-requests 64 --long-prompt 8192
        --long-new-tokens 256] [--chat-conversations 16 --chat-turns 4 --chat-turn-tokens 512 --chat-new-tokens 128]

Each ratio runs against a memd child process of its own (these flags, memd's defaults for the rest) and an engine
built in this process (DFLASH as served), one ratio after the other. Per ratio:

- the KV pools: target and draft tokens and bytes from memd's Capacity and from its start-up log (measured), beside
  what memd.sizing.size_from_budget gives for memd's inputs (the formula);
- the most requests of each context (prompt and answer, in tokens) that run at once without preemption. The formula:
  a request holds the pages of every position but its last (whose K/V is never computed), so the target pool holds
  tokens // page_ceil(context - 1) of them, and memd's request rows at most --max-running-requests. Measured: that
  many requests (random prompts of the context less --fit-new-tokens, then that many greedy tokens) submitted at
  once must all run at once with the scheduler's preemption count unchanged, and one more must not (it is
  preempted, or waits for room); past the rows there is no such run. The requests are admitted one prefill chunk
  after another, so they reach their full context together only if the first still decodes when the last prompt
  is in: --fit-new-tokens greedy steps must outlast about (count - 1) x prompt / --chunked-prefill-size steps, or
  more requests fit than the formula says. A context pool/N is the N-th part of the largest target pool of the
  run, in whole pages (small pools, as the CPU test's, get contexts of their size);
- a long-context workload where memory should bind (--long-*, all submitted at once): tokens/s and preemptions;
- a multi-turn chat (--chat-*; 0 conversations: none): every conversation's turn submitted at once, each turn's
  prompt the last turn's prompt and answer and --chat-turn-tokens new ones; the prefix cache's hit rate (cached
  tokens over prompt tokens) and the mean time to first token, of the turns after the first (the first has nothing
  to hit), and of the first turns;
- the long-context workload's greedy outputs, which must be equal at every ratio (the ratio changes memory, never
  tokens): the run prints whether they are and exits 1 when they are not.

Every ratio's run ends with memd's pools wholly free once the prefix cache is flushed (a leak would shrink the pool
the next workload measures); the run fails otherwise. A smaller --decode-lookahead, --draft-eviction-interval or
--chunked-prefill-size shrinks the draft pool's request cap, so that a small budget runs ratio 0.25 at all.
"""

import argparse
import sys

from bench.common.memd_process import memd_process
from bench.common.rows import add_model_arguments
from bench.memd.pool_report import report
from bench.memd.pool_runs import greedy_equal, measure_ratio
from bench.memd.pool_sizes import POOL_SHARE, context_limit, formula_sizes, memd_config, memd_flags, resolve_context
from memd.geometry import read_geometry
from memd.sizing import PoolSizes
from modeld.model.fetch_default import ensure_default_model


def ratio_list(text: str) -> list[float]:
    """--draft-kv-ratio: comma-separated ratios in (0, 1], at least two (the run compares them)."""
    try:
        ratios = [float(r) for r in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not comma-separated numbers") from None
    if len(ratios) < 2 or len(set(ratios)) < len(ratios) or not all(0 < r <= 1 for r in ratios):
        raise argparse.ArgumentTypeError(f"{text!r}: give two or more different ratios in (0, 1]")
    return ratios


def context_list(text: str) -> list[str]:
    """--contexts: comma-separated token counts (at least 2) or pool/N; an empty list runs no fit."""
    entries = [e.strip() for e in text.split(",") if e.strip()]
    for entry in entries:
        if not (POOL_SHARE.fullmatch(entry) or (entry.isdigit() and int(entry) >= 2)):
            raise argparse.ArgumentTypeError(f"{entry!r} is neither a context of 2 tokens or more nor pool/N")
    return entries


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.memd.pool_payoff",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_arguments(p)
    add_memd_arguments(p)
    add_workload_arguments(p)
    return p


def add_memd_arguments(p: argparse.ArgumentParser) -> None:
    """memd's flags, by memd's names: the same at every ratio."""
    p.add_argument("--kv-budget-bytes", type=int, required=True, help="bytes for both KV pools, at every ratio")
    p.add_argument("--draft-kv-ratio", type=ratio_list, default="1,0.25,0.5", help="default: 1,0.25,0.5")
    p.add_argument("--draft-window", type=int, help="the draft pool's window (default: the draft's sliding window)")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--max-running-requests", type=int, default=64)
    p.add_argument("--chunked-prefill-size", type=int, help="default: memd's")
    p.add_argument("--decode-lookahead", type=int, help="default: memd's (with a draft pool)")
    p.add_argument("--draft-eviction-interval", type=int, help="default: memd's")


def add_workload_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--contexts", type=context_list, default="2048,8192,32768", help="default: 2048,8192,32768")
    p.add_argument("--fit-new-tokens", type=int, default=128, help="tokens each fit run's requests decode")
    p.add_argument("--long-requests", type=int, default=64)
    p.add_argument("--long-prompt", type=int, default=8192)
    p.add_argument("--long-new-tokens", type=int, default=256)
    p.add_argument("--chat-conversations", type=int, default=16)
    p.add_argument("--chat-turns", type=int, default=4)
    p.add_argument("--chat-turn-tokens", type=int, default=512, help="new prompt tokens each turn")
    p.add_argument("--chat-new-tokens", type=int, default=128, help="tokens each turn's answer decodes")


def parse_args(argv=None) -> argparse.Namespace:
    """The command line, with the target's folder (the default model, fetched if need be) and the draft's window
    filled in, args.sizes the formula's pools at each ratio and args.contexts in tokens; a usage error for a run
    memd would refuse or whose requests could not run."""
    p = build_parser()
    args = p.parse_args(argv)
    if args.draft == "none":
        p.error("the draft pool's ratio needs a draft: drop --draft none")
    args.target = args.target or str(ensure_default_model())
    args.draft_window = args.draft_window or read_geometry(args.draft, draft=True).sliding_window
    if args.draft_window is None:
        p.error("the draft has no sliding window: give --draft-window")
    args.sizes = planned_sizes(p, args)
    args.contexts = resolved_contexts(p, args)
    check_workloads(p, args)
    return args


def check_workloads(p: argparse.ArgumentParser, args) -> None:
    """Every request of the long-context workload and the chat fits memd's context length at every ratio."""
    limit = min(context_limit(args, sizes) for sizes in args.sizes.values())
    if min(args.long_requests, args.long_prompt, args.long_new_tokens) < 1:
        p.error("the long-context workload (its outputs are compared) needs a request, a prompt and a new token")
    if args.long_prompt + args.long_new_tokens > limit:
        p.error(f"the long-context requests are longer than memd's context length at some ratio, {limit}")
    if args.chat_conversations and min(args.chat_turns, args.chat_turn_tokens, args.chat_new_tokens) < 1:
        p.error("a chat needs a turn, its tokens and its answer")
    if args.chat_conversations and args.chat_turns * (args.chat_turn_tokens + args.chat_new_tokens) > limit:
        p.error(f"the chat's last turn is longer than memd's context length at some ratio, {limit}")


def planned_sizes(p: argparse.ArgumentParser, args) -> dict[float, PoolSizes]:
    """The formula's pools at each ratio; a usage error for settings memd would refuse to start with (a ratio too
    small for its request cap, a bad flag, a folder without a readable config.json)."""
    try:
        return {ratio: formula_sizes(memd_config(args, ratio)) for ratio in args.draft_kv_ratio}
    except ValueError as exc:  # SizingError and GeometryError among them
        p.error(str(exc))


def resolved_contexts(p: argparse.ArgumentParser, args) -> list[int]:
    largest = max(s.target_tokens for s in args.sizes.values())
    contexts = [resolve_context(entry, largest, args.page_size) for entry in args.contexts]
    if args.fit_new_tokens < 1:
        p.error("--fit-new-tokens must be at least 1")
    if contexts and min(contexts) <= args.fit_new_tokens:
        p.error(f"--fit-new-tokens {args.fit_new_tokens} leaves no prompt in a context of {min(contexts)} tokens")
    return contexts


def main(argv=None) -> int:
    args = parse_args(argv)
    runs = []
    for ratio in args.draft_kv_ratio:
        with memd_process(*memd_flags(args, ratio)) as address:
            runs.append(measure_ratio(address, ratio, args))
    print(report(runs, args))
    return 0 if greedy_equal(runs) else 1


if __name__ == "__main__":
    sys.exit(main())
