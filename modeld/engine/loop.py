"""The engine thread: schedule a step, run it (modeld.runner.model_runner: inputs -> forward; modeld.spec.worker: draft, acceptance,
draft K/V), sample, hand the tokens to output processing (modeld.engine.output: stop rules, streaming), finish. One thread
owns all request state; other threads talk to it through `submit` / `abort` and each request's queue. After each
pass it hands the requests whose queues got events to `listener` (one call a pass: in modeld's engine process, one
message to the gRPC front)."""

import logging
import queue
import threading
import time
from collections.abc import Callable
from itertools import accumulate

import grpc
import torch

from modeld.engine import metrics
from modeld.engine.memd_link import MemdLink
from modeld.engine.output import OutputProcessor
from modeld.engine.scheduler import Scheduler, StepItem
from modeld.request import Finish, Request
from modeld.runner.decode_chain import decode_chain
from modeld.runner.model_runner import ModelRunner, row_index
from modeld.runner.sampling import sample
from modeld.runner.step_ahead import HostCopy, StepAhead
from modeld.spec.worker import DflashWorker

log = logging.getLogger("modeld")


class Engine:
    def __init__(
        self,
        runner: ModelRunner,
        scheduler: Scheduler,
        tokenizer,
        eos_ids: set[int],
        context_len: int,
        link: MemdLink,
        dflash: DflashWorker | None = None,
        trim_draft: bool = False,
        stream_interval: int = 1,
        overlap_decode: bool = False,
    ):
        self.runner = runner
        self.link = link
        self.dflash = dflash
        self.trim_draft = trim_draft  # bounded draft pool: ask memd to free out-of-window draft slots each step
        self.spec = {"spec_drafts": 0, "spec_draft_tokens": 0, "spec_accepted_tokens": 0}
        self.verifies_by_accepted = [0] * (
            dflash.block if dflash is not None else 0
        )  # [a]: verifies accepting a drafts
        self.scheduler = scheduler
        self.ahead = StepAhead(runner, dflash, overlap_decode)  # a decode step queued before the last is committed
        self.output = OutputProcessor(tokenizer, eos_ids, context_len, stream_interval)
        self.inbox: queue.Queue = queue.Queue()
        self.wake = threading.Event()
        self.requests: dict[str, Request] = {}  # the engine thread's own view
        self.live: dict[str, Request] = {}  # ids from submit() to completion, for the gRPC threads
        self.live_lock = threading.Lock()
        self.stopped = threading.Event()
        self.listener: Callable[[list[Request]], None] | None = None
        # called on the engine thread if it stops unasked (a bug past every handler): never die silently. In-process,
        # health turns NOT_SERVING; modeld's engine process tells the front instead (modeld.engine.process).
        self.on_death: Callable[[], None] = lambda: self.link.on_health(False)
        self.delivered: list[Request] = []  # requests given events in this pass, for the listener
        self.thread = threading.Thread(target=self._loop, name="modeld-engine", daemon=True)

    # ---- called from gRPC threads -------------------------------------------------------
    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()
        self.wake.set()
        self.thread.join(timeout=30)

    def submit(self, req: Request) -> bool:
        """Queue a request; False when a request with its id is still running."""
        with self.live_lock:
            if req.rid in self.live:
                return False
            self.live[req.rid] = req
            self.inbox.put(("add", req))
        self.wake.set()
        return True

    def abort(self, rid: str) -> bool:
        """Abort a submitted request (queued after its submit, so never lost); False if unknown."""
        with self.live_lock:
            if rid not in self.live:
                return False
            self.inbox.put(("abort", rid))
        self.wake.set()
        return True

    def counts(self) -> tuple[int, int]:
        return len(self.scheduler.running), len(self.scheduler.waiting)

    # ---- the engine thread ----------------------------------------------------------------
    def _loop(self) -> None:
        try:
            while not self.stopped.is_set():
                if self.link.lost:  # memd is gone: its lease freed our slots; fail what runs, wait for memd
                    self._fail_all("UNAVAILABLE", "memd is unreachable", memd_alive=False)
                    self._deliver()
                    self.link.reattach(self.stopped)
                    continue
                self._drain_inbox()
                try:
                    busy = self._step()
                except grpc.RpcError as exc:  # memd is gone or refused the step
                    log.error("memd call failed: %s %s", exc.code().name, exc.details())
                    self._fail_all(
                        exc.code().name, f"memd: {exc.details()}", memd_alive=exc.code() != grpc.StatusCode.UNAVAILABLE
                    )
                    busy = False
                except Exception as exc:  # a bug outside the forward: fail what runs, keep serving
                    log.exception("engine step failed")
                    self._fail_all("INTERNAL", f"engine step failed: {exc}", memd_alive=True)
                    busy = False
                self._deliver()
                if not busy:
                    self.wake.wait(0.5)
                    self.wake.clear()
            self._fail_all("UNAVAILABLE", "modeld is shutting down", memd_alive=True)
            self._deliver()
        except BaseException:
            log.critical("the engine thread stopped", exc_info=True)
            self.on_death()
            raise

    def _deliver(self) -> None:
        if self.delivered and self.listener is not None:
            self.listener(self.delivered)
        self.delivered = []

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
        started = time.perf_counter()
        queued = self.ahead.take()
        if queued is None:
            items, hopeless = self.scheduler.next_step()
            for req in hopeless:
                self._complete(req)
            if not items:
                self.scheduler.memd.release_idle()
                return False
        else:  # a request finished or aborted since that step was queued: its token there is dropped
            items = [item for item in queued.items if item.req.finish is None]
            if not items:
                queued.copy.wait()  # the device is done with it before memd frees what it wrote
                return True
        try:
            committed = self._run(items) if queued is None else self._run_queued(queued, items)
        except Exception as exc:  # a bug or a device error: fail the batch, keep serving
            log.exception("step failed")
            self.ahead.drop()
            for item in items:
                item.req.finish = Finish("abort", error_code="INTERNAL", error=f"step failed: {exc}")
                self._complete(item.req)
            return True
        metrics.step_done(started, committed)
        for item, tokens, per_step in committed:
            before = len(item.req.output_ids)
            finished = bool(tokens) and self.output.append(item.req, tokens)
            if tokens and item.req.stream:
                self.delivered.append(item.req)
            if item.verify:
                self._count_verifies(item.req, per_step, len(item.req.output_ids) - before)
            elif self.dflash is not None and before:  # a decode that verified nothing (the prompt's token is not one)
                item.req.unverified_tokens += len(item.req.output_ids) - before
            if finished:
                self._complete(item.req)
        return True

    def _queues_next(self, items: list[StepItem]) -> bool:
        """Whether to queue the decode step after these items before committing them (modeld.runner.step_ahead)."""
        return self.ahead.enabled and self.inbox.empty() and self.scheduler.continues(items)

    def _run_queued(self, queued, items: list[StepItem]) -> list[tuple[StepItem, list[int], list[int]]]:
        """The tokens of a decode step queued ahead (`items`: its requests still running), after queueing the step
        after it when the batch goes on unchanged."""
        if len(items) == len(queued.items) and self._queues_next(items):
            self.ahead.queue_next(items, queued.inputs, queued.tokens)
        host = queued.copy.values()
        live = {id(item) for item in items}
        return self._commit_tokens(items, [[[token]] for item, token in zip(queued.items, host) if id(item) in live])

    def _run(self, items: list[StepItem]) -> list[tuple[StepItem, list[int], list[int]]]:
        """Draft (DFLASH), one target forward, sampling, acceptance: the tokens each item commits. Everything
        stays on the device until one copy of the step's sampled tokens (and accepted lengths) to the host. A batch
        whose requests hold the slots may run several such steps before that copy (steps_ahead): greedy verify steps
        and greedy decode steps in one graph replay, other decode steps as a chain of replays (decode_chain)."""
        inputs = self.runner.prepare(items)
        verify = inputs.verify
        greedy = all(item.req.params.greedy for item in items)
        k = self.runner.steps_ahead(items, inputs)
        cycles = self.dflash.replay_greedy_cycles(inputs, k) if verify and greedy else None
        if cycles is not None:  # whole verify steps in one graph: per step, its tokens, then its committed lengths
            block, width = self.dflash.block, inputs.graph[0] * self.dflash.block
            host = cycles.tolist()
            return self._commit_tokens(
                items, [[row[i * block : i * block + row[width + i]] for row in host] for i in range(len(items))]
            )
        if k > 1 and not verify:  # decode steps back to back: one graph of k greedy steps, else a chain of replays
            if greedy and self.runner.has_decode_steps(inputs, k):
                steps = self.runner.replay_decode_steps(inputs, k)
            else:
                steps = decode_chain(
                    self.runner,
                    self.dflash,
                    inputs,
                    [item.req.params for item in items],
                    [item.req.generator for item in items],
                    k,
                )
            host = steps.tolist()
            return self._commit_tokens(items, [[[row[i]] for row in host] for i in range(len(items))])
        drafts = self.dflash.propose_into(inputs, max(items[i].req.computed for i in verify)) if verify else None
        out = self.runner.forward(inputs)
        # Rows sampled per item: a verify block's every row; otherwise the last row, once the item's
        # pending tokens are all computed (a prompt chunk short of the end samples nothing).
        counts = [item.num_tokens if item.verify else int(item.num_tokens == item.req.pending) for item in items]
        owners = [item for item, n in zip(items, counts) for _ in range(n)]
        firsts = [0, *accumulate(counts)][:-1]  # each item's first sampled row
        sampled = None
        if owners:
            rows = [off + item.num_tokens - n + j for item, off, n in zip(items, out.offsets, counts) for j in range(n)]
            picked = row_index(rows, len(out.hidden), out.hidden.device)
            if out.greedy is not None and greedy:  # the decode graph took the argmax of every row
                sampled = out.greedy[picked]
            else:
                logits = self.runner.model.logits(out.hidden[picked])
                sampled = sample(logits, [o.req.params for o in owners], [o.req.generator for o in owners])
        lengths = None
        if self.dflash is not None:
            verify_rows = [firsts[i] + j for i in verify for j in range(counts[i])]
            target = sampled[row_index(verify_rows, len(owners), sampled.device)] if verify else None
            lengths = self.dflash.after_forward(inputs, out, drafts, target)
        if lengths is None and owners and self._queues_next(items):  # the next step first, then this one's tokens
            copied = HostCopy.of(sampled)
            self.ahead.queue_next(items, inputs, sampled)
            host = copied.values()
        else:
            host = (sampled if lengths is None else torch.cat([sampled, lengths])).tolist() if owners else []
        committed_lens = iter(host[len(owners) :])
        return self._commit_tokens(
            items,
            [
                [host[first : first + n][: next(committed_lens) if item.verify else n]]
                for item, n, first in zip(items, counts, firsts)
            ],
        )

    def _commit_tokens(self, items, steps: list[list[list[int]]]) -> list[tuple[StepItem, list[int], list[int]]]:
        """Advances every request by what its item computed in each step of the replay (steps[i]: item i's tokens per
        step: a verify's committed tokens, a decode's token, a prompt chunk's sampled token or none). Returns, per
        item, its tokens and how many it committed in each step."""
        results, memd = [], self.scheduler.memd
        for item, per_step in zip(items, steps):
            req, before = item.req, item.req.computed
            tokens = [t for step in per_step for t in step]
            if item.verify:
                req.computed += len(tokens)  # each block's first token and its accepted drafts
                memd.commit(req, req.computed)
            else:
                req.computed += item.num_tokens * len(per_step)
                if before < len(req.prompt_ids) <= req.computed:
                    memd.checkpoint(req)  # the prompt is computed: memd caches it now
            if self.trim_draft:
                memd.trim(req)
            results.append((item, tokens, [len(step) for step in per_step]))
        return results

    def _count_verifies(self, req: Request, committed: list[int], output: int) -> None:
        """Counts the verified blocks whose tokens reached the output (`output` tokens did): a block a replay ran
        after its request finished is not one of its verifies."""
        for n in committed:
            if output <= 0:
                return
            output -= n
            req.spec_verify_ct += 1
            self.spec["spec_drafts"] += 1
            self.spec["spec_draft_tokens"] += self.dflash.block - 1
            self.spec["spec_accepted_tokens"] += n - 1
            self.verifies_by_accepted[n - 1] += 1

    def _complete(self, req: Request) -> None:
        self.output.flush(req)  # an aborted request's tokens held back by the stream interval
        metrics.request_done(req)
        self.scheduler.remove(req)
        self.requests.pop(req.rid, None)
        with self.live_lock:
            self.live.pop(req.rid, None)
        req.events.put(("complete", req))
        self.delivered.append(req)

    def _fail_all(self, code: str, message: str, memd_alive: bool) -> None:
        self.ahead.drop()  # before any release reaches memd
        for req in list(self.requests.values()):
            req.finish = Finish("abort", error_code=code, error=message)
            if not memd_alive:
                req.in_memd = False  # the lease of a lost session frees its slots in memd
            self._complete(req)
        if not memd_alive:
            self.scheduler.memd.drop_releases()  # the lost session's slots are gone with it
            return
        try:
            self.scheduler.memd.flush_releases()
        except grpc.RpcError as exc:
            log.error("could not release slots in memd: %s", exc.details())


def make_generator(seed: int | None, device: str) -> torch.Generator:
    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return gen
