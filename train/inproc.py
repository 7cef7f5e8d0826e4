"""Answers through modeld's engine in this process: memd as usual (its own process, the only allocator), the
engine thread here, no gRPC. At hundreds of requests in flight the per-token gRPC stream costs about three
quarters of the throughput (BENCHMARKS.md, answers generated for training: the engine alone ran 20 K tokens/s,
the same engine behind gRPC 4.5 K); the answers are the service's own, the request built as modeld's service builds it (the
same sampling parameters and seeded generator), the tokens the same. Nobody streams these requests: the engine
neither detokenises them nor queues their chunks (Request.stream False).

Up to --concurrency conversations are in flight; a multi-turn conversation sends its next turn when the last
one completes. At the budget (or a signal) requests still in flight are aborted and their slots go back to
memd; they are redone by the next run. An answer that runs into a repetition loop is stopped there and kept
(train.loops.ends_in_loop, looked at every LOOP_CHECK_S): the copies it would go on making to the token limit
were 26.9 % of the answer tokens of the first 73,642 answers, and the trainer anchors no block in them.
"""

import itertools
import queue
import signal
import time

from modeld.config import ModeldConfig
from modeld.engine.build import build_engine
from modeld.engine.loop import make_generator
from modeld.request import Request
from modeld.sampling_params import SamplingParams
from train import chat, loops

LOOP_CHECK_S = 1.0  # how often the answers in flight are looked at for a repetition loop


class GenerationFailed(RuntimeError):
    """modeld's engine failed a request (an error, not the budget)."""


def sampling_params(temperature: float, top_p: float, max_new_tokens: int, seed: int | None) -> SamplingParams:
    """What modeld's service makes of generate_modeld's request: greedy, or temperature + top-p with a seed."""
    if temperature == 0:
        return SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
    return SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed)


def generate_inproc(memd: str, jobs, tokenizer, temperatures, args, writer, stop, log, seed_of, meta) -> int:
    """Answers every job (record, sample index) it can before `stop()`; returns how many were written."""
    cfg = ModeldConfig(
        device=args.device,
        memd=memd,
        target_model=args.target,
        speculative_algorithm="none",
    )
    built = build_engine(cfg, lambda serving: None)
    engine, done = built.engine, queue.SimpleQueue()  # every request's "complete" (no chunks: stream=False)
    conversations: dict[str, tuple[dict, int, list, Request]] = {}  # rid -> (record, sample, answers so far, request)
    looping: set[str] = set()  # aborted by us in a repetition loop: their answers so far are kept
    rids = itertools.count()
    jobs = iter(jobs)

    def send(record: dict, k: int, answers: list) -> None:
        t = temperatures[k]
        params = sampling_params(t, args.top_p, args.max_new_tokens, None if t == 0 else seed_of(record, k))
        rid = f"gen-{next(rids)}"
        req = Request(
            rid=rid,
            prompt_ids=chat.turn_prompt(tokenizer, record, answers),
            params=params,
            generator=None if params.greedy else make_generator(params.seed, args.device),
            events=done,
            stream=False,
        )
        conversations[rid] = (record, k, answers, req)
        engine.submit(req)

    def stop_loops() -> None:
        for rid, (*_, req) in conversations.items():
            if rid not in looping and loops.ends_in_loop(list(req.output_ids)) and engine.abort(rid):
                looping.add(rid)

    previous = {
        sig: signal.signal(sig, lambda *_: setattr(stop, "flag", True)) for sig in (signal.SIGTERM, signal.SIGINT)
    }
    engine.start()
    finished = 0
    try:
        for record, k in itertools.islice(jobs, args.concurrency):
            send(record, k, [])
        looked = time.monotonic()
        while conversations and not stop():
            if time.monotonic() - looked >= LOOP_CHECK_S:
                stop_loops()
                looked = time.monotonic()
            try:
                _, req = done.get(timeout=max(0.01, min(LOOP_CHECK_S, stop.left())))  # ("complete", req)
            except queue.Empty:
                continue
            record, k, answers, _ = conversations.pop(req.rid)
            if req.finish.reason == "abort" and req.rid not in looping:
                raise GenerationFailed(f"{record['id']}: {req.finish.error_code} {req.finish.error}")
            looping.discard(req.rid)
            answers.append(list(req.output_ids))
            if len(answers) < len(record["turns"]):
                send(record, k, answers)
                continue
            writer.add(meta(record, k, temperatures[k], answers), answers)
            finished += 1
            stop.count()
            if finished % 500 == 0:
                log(f"{finished} answered")
            for record, k in itertools.islice(jobs, 1):
                send(record, k, [])
    finally:
        engine.stop()  # fails what still runs (abandoned: the next run redoes it) and releases its slots in memd
        built.link.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return finished
