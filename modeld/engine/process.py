"""The engine's own process: memd's session, the model, the scheduler and the engine thread, apart from the gRPC
front (modeld.front.engine_client), so that the front's Python (streams, detokenization, one message per chunk) never
competes with a step for the same interpreter lock.

The two talk over one duplex pipe of pickled tuples:
    front -> engine   ("add", rid, prompt_ids, params, arrived)   ("abort", rid)   ("query", qid)   ("stop",)
    engine -> front   ("ready", info, vocab_size, context_len, tokenizer)   ("failed", message)
                      ("out", [(rid, chunk or None, final or None), ...])  one message per engine pass
                      ("health", serving)   ("limits", info, context_len)   ("reply", qid, (running, waiting, spec))
                      ("metrics", families)  with --metrics-port, every SNAPSHOT_INTERVAL_S (modeld.engine.metrics)
                      ("dead",)  the engine thread stopped unasked (the process exits within a second)
A chunk is (ids, text or None, finished, logprobs or None), the request's events of the pass merged; `final` (its last
pass) holds what the complete message needs. The process ignores stop signals (the front stops it with "stop", and a
front that is gone ends the pipe: EOF stops it too); stopping fails what still runs and closes memd's session."""

import logging
import os
import signal
import sys
import threading
import time

from memd.plan import ConfigError
from modeld.config import ModeldConfig
from modeld.engine.heap_freeze import freeze_heap, refreeze
from modeld.engine.memd_link import StartupError
from modeld.engine.metrics import SNAPSHOT_INTERVAL_S, snapshot, watch_engine
from modeld.engine.output import take_events
from modeld.request import Request

STARTUP_ERRORS = (StartupError, ConfigError, FileNotFoundError, ValueError)  # a DraftError is a ValueError
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
log = logging.getLogger("modeld")


def final_of(req: Request) -> dict:
    """What the front's complete message needs of a finished request: Request attributes by name."""
    return dict(
        finish=req.finish,
        output_ids=req.output_ids,
        output_logprobs=req.output_logprobs,
        cached_tokens=req.cached_tokens,
        spec_verify_ct=req.spec_verify_ct,
        unverified_tokens=req.unverified_tokens,
    )


def outcomes(requests: list[Request]) -> list[tuple]:
    """Each request's events of this pass (a request listed twice gives nothing the second time)."""
    out = []
    for req in requests:
        chunk, complete = take_events(req.events)
        if chunk is not None or complete:
            out.append((req.rid, chunk, final_of(req) if complete else None))
    return out


def engine_main(cfg: ModeldConfig, conn) -> None:
    """The engine process's body (multiprocessing, spawned by the front). It leaves with os._exit once it has
    stopped: letting the interpreter finalise gRPC's channels while their C-core threads wind down sometimes aborts
    the process ("terminate called without an active exception"), seen after a re-attach to memd."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    logging.basicConfig(level=cfg.log_level, format="%(asctime)s modeld %(levelname)s %(message)s", stream=sys.stderr)
    code = 0
    try:
        run_engine(cfg, conn)
    except BaseException:
        log.exception("the engine process failed")
        code = 1
    finally:
        logging.shutdown()
        sys.stderr.flush()
        os._exit(code)


def run_engine(cfg: ModeldConfig, conn) -> None:
    from modeld.engine.build import build_engine  # torch and the model code: imported here, never by the front

    lock = threading.Lock()  # the engine thread, memd's watcher and this thread all send
    front_gone = threading.Event()

    def send(message) -> None:
        """To the front; once the front is gone (the pipe broke: it was killed), one log line and nothing more:
        this process is stopping (serve_front reads the pipe's end), and no thread's send fails with a traceback."""
        with lock:
            if front_gone.is_set():
                return
            try:
                conn.send(message)
            except OSError:  # BrokenPipeError, ConnectionResetError
                front_gone.set()
                log.warning("the gRPC front is gone (its pipe broke): the engine stops")

    try:
        built = build_engine(cfg, lambda serving: send(("health", serving)))
    except STARTUP_ERRORS as exc:
        send(("failed", str(exc)))
        return
    except Exception as exc:  # a bug, or the device (out of memory, say): its traceback goes to the log
        log.exception("the engine could not start")
        send(("failed", f"the engine could not start: {type(exc).__name__}: {exc}"))
        return
    engine, link = built.engine, built.link
    link.rebinders.append(lambda session, pools: send(("limits", dict(built.info), engine.output.context_len)))
    link.rebinders.append(lambda session, pools: refreeze("after the re-attach"))  # after the graphs' capture
    engine.listener = lambda requests: send(("out", outcomes(requests)))
    engine.on_death = lambda: send(("dead",))  # the front fails what is open at once; this process exits after
    if cfg.metrics_port is not None:
        watch_engine(engine)
    freeze_heap("at start")  # the model, its graphs and the engine: no full collection walks them mid-step
    engine.start()
    link.start_watching()
    send(("ready", dict(built.info), built.vocab_size, engine.output.context_len, built.tokenizer))
    try:
        serve_front(cfg, conn, engine, send)
    finally:
        link.closing = True
        engine.stop()  # its last pass fails what still runs and hands it to the front
        built.close()


def serve_front(cfg: ModeldConfig, conn, engine, send) -> None:
    """The front's commands, until "stop", the end of the pipe, or the end of the engine thread (then this process
    exits, and the front fails what was open and turns NOT_SERVING)."""
    from modeld.engine.loop import make_generator  # imported by run_engine's build_engine already: no cost here

    metrics_due = time.monotonic() if cfg.metrics_port is not None else float("inf")
    while True:
        if time.monotonic() >= metrics_due:
            send(("metrics", snapshot()))
            metrics_due = time.monotonic() + SNAPSHOT_INTERVAL_S
        try:
            if not conn.poll(SNAPSHOT_INTERVAL_S):
                if not engine.thread.is_alive():
                    log.critical("the engine thread has stopped: the engine process exits")
                    return
                continue
            command = conn.recv()
        except (EOFError, OSError):
            log.info("the gRPC front is gone: the engine stops")
            return
        kind = command[0]
        if kind == "add":
            # arrived: the front's perf_counter, a clock both processes share (CLOCK_MONOTONIC), for the latencies
            _, rid, prompt_ids, params, arrived = command
            generator = None if params.greedy else make_generator(params.seed, cfg.device)
            engine.submit(Request(rid=rid, prompt_ids=prompt_ids, params=params, generator=generator, arrived=arrived))
        elif kind == "abort":
            engine.abort(command[1])
        elif kind == "query":
            running, waiting = engine.counts()
            send(("reply", command[1], (running, waiting, dict(engine.spec))))
        elif kind == "stop":
            return
