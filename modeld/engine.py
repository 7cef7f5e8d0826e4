"""The engine thread: schedule a step, run it, sample, stream, finish. One thread owns all
request state; gRPC handlers talk to it through `submit` / `abort` and each request's queue."""

import logging
import queue
import threading

import grpc
import torch

from modeld.detokenize import new_text
from modeld.request import Finish, Request
from modeld.runner import ModelRunner
from modeld.sampling import sample
from modeld.scheduler import Scheduler

log = logging.getLogger("modeld")


class Engine:
    def __init__(self, runner: ModelRunner, scheduler: Scheduler, tokenizer, eos_ids: set[int], context_len: int):
        self.runner = runner
        self.scheduler = scheduler
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.context_len = context_len
        self.inbox: queue.Queue = queue.Queue()
        self.wake = threading.Event()
        self.requests: dict[str, Request] = {}
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="modeld-engine", daemon=True)

    # ---- called from gRPC threads -------------------------------------------------------
    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()
        self.wake.set()
        self.thread.join(timeout=30)

    def submit(self, req: Request) -> None:
        self.inbox.put(("add", req))
        self.wake.set()

    def abort(self, rid: str) -> None:
        self.inbox.put(("abort", rid))
        self.wake.set()

    def counts(self) -> tuple[int, int]:
        return len(self.scheduler.running), len(self.scheduler.waiting)

    # ---- the engine thread ----------------------------------------------------------------
    def _loop(self) -> None:
        while not self.stopped.is_set():
            self._drain_inbox()
            try:
                busy = self._step()
            except grpc.RpcError as exc:  # memd is gone or refused the step
                log.error("memd call failed: %s %s", exc.code().name, exc.details())
                self._fail_all(exc.code().name, f"memd: {exc.details()}", memd_alive=exc.code() != grpc.StatusCode.UNAVAILABLE)
                busy = False
            if not busy:
                self.wake.wait(0.5)
                self.wake.clear()
        self._fail_all("UNAVAILABLE", "modeld is shutting down", memd_alive=True)

    def _drain_inbox(self) -> None:
        while True:
            try:
                kind, value = self.inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                self.requests[value.rid] = value
                self.scheduler.add(value)
            elif value in self.requests:
                req = self.requests[value]
                req.finish = Finish("abort")
                self._complete(req)

    def _step(self) -> bool:
        items, hopeless = self.scheduler.next_step()
        for req in hopeless:
            self._complete(req)
        if not items:
            self.scheduler.flush_releases()
            return False
        try:
            sampling, logits = self.runner.forward(items)
        except Exception as exc:  # a bug or a device error: fail the batch, keep serving
            log.exception("forward failed")
            for item in items:
                item.req.finish = Finish("abort", error_code="INTERNAL", error=f"forward failed: {exc}")
                self._complete(item.req)
            return True
        for item in items:
            item.req.computed += item.num_tokens
        tokens = sample(logits, [i.req.params for i in sampling], [i.req.generator for i in sampling])
        for item, token in zip(sampling, tokens):
            self._append(item.req, token)
        return True

    def _append(self, req: Request, token: int) -> None:
        req.output_ids.append(token)
        p = req.params
        if not p.ignore_eos and token in self.eos_ids:
            req.finish = Finish("stop")
        elif token in p.stop_token_ids:
            req.finish = Finish("stop", matched_stop=str(token))
        elif len(req.output_ids) >= p.max_new_tokens or len(req.all_ids) >= self.context_len:
            req.finish = Finish("length")
        text, stop = new_text(self.tokenizer, req)
        if stop is not None:
            req.finish = stop
        new_ids = req.output_ids[req.sent_ids :]
        if text or new_ids:
            req.events.put(("chunk", new_ids, text))
            req.sent_ids = len(req.output_ids)
            req.sent_text += text
        if req.finish is not None:
            self._complete(req)

    def _complete(self, req: Request) -> None:
        self.scheduler.remove(req)
        self.requests.pop(req.rid, None)
        req.events.put(("complete", req))

    def _fail_all(self, code: str, message: str, memd_alive: bool) -> None:
        for req in list(self.requests.values()):
            req.finish = Finish("abort", error_code=code, error=message)
            if not memd_alive:
                req.in_memd = False  # the lease of a lost session frees its slots in memd
            self._complete(req)
        if not memd_alive:
            self.scheduler.releases.clear()
            return
        try:
            self.scheduler.flush_releases()
        except grpc.RpcError as exc:
            log.error("could not release slots in memd: %s", exc.details())


def make_generator(seed: int | None, device: str) -> torch.Generator:
    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return gen
