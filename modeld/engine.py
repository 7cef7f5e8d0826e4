"""The engine thread: schedule a step, run it, sample, stream, finish. One thread owns all
request state; gRPC handlers talk to it through `submit` / `abort` and each request's queue."""

import logging
import queue
import threading

import grpc
import torch

from modeld.detokenize import new_text
from modeld.dflash import DflashWorker, accept_lengths
from modeld.memd_link import MemdLink
from modeld.request import Finish, Request
from modeld.runner import ModelRunner, StepOutput
from modeld.sampling import sample
from modeld.scheduler import Scheduler, StepItem

log = logging.getLogger("modeld")


class Engine:
    def __init__(self, runner: ModelRunner, scheduler: Scheduler, tokenizer, eos_ids: set[int], context_len: int,
                 link: MemdLink, dflash: DflashWorker | None = None, trim_draft: bool = False):
        self.runner = runner
        self.link = link
        self.dflash = dflash
        self.trim_draft = trim_draft  # bounded draft pool: ask memd to free out-of-window draft slots each step
        self.spec = {"spec_drafts": 0, "spec_draft_tokens": 0, "spec_accepted_tokens": 0}
        self.scheduler = scheduler
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.context_len = context_len
        self.inbox: queue.Queue = queue.Queue()
        self.wake = threading.Event()
        self.requests: dict[str, Request] = {}  # the engine thread's own view
        self.live: dict[str, Request] = {}  # ids from submit() to completion, for the gRPC threads
        self.live_lock = threading.Lock()
        self.stopped = threading.Event()
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
                    self.link.reattach(self.stopped)
                    continue
                self._drain_inbox()
                try:
                    busy = self._step()
                except grpc.RpcError as exc:  # memd is gone or refused the step
                    log.error("memd call failed: %s %s", exc.code().name, exc.details())
                    self._fail_all(exc.code().name, f"memd: {exc.details()}", memd_alive=exc.code() != grpc.StatusCode.UNAVAILABLE)
                    busy = False
                except Exception as exc:  # a bug outside the forward: fail what runs, keep serving
                    log.exception("engine step failed")
                    self._fail_all("INTERNAL", f"engine step failed: {exc}", memd_alive=True)
                    busy = False
                if not busy:
                    self.wake.wait(0.5)
                    self.wake.clear()
            self._fail_all("UNAVAILABLE", "modeld is shutting down", memd_alive=True)
        except BaseException:
            log.critical("the engine thread stopped", exc_info=True)
            self.link.on_health(False)  # never die silently: health turns NOT_SERVING
            raise

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
            committed = self._run(items)
        except Exception as exc:  # a bug or a device error: fail the batch, keep serving
            log.exception("step failed")
            for item in items:
                item.req.finish = Finish("abort", error_code="INTERNAL", error=f"step failed: {exc}")
                self._complete(item.req)
            return True
        for item, tokens in committed:
            if tokens:
                self._append(item.req, tokens)
        return True

    def _run(self, items: list[StepItem]) -> list[tuple[StepItem, list[int]]]:
        """Draft (DFLASH), one target forward, sampling, acceptance: the tokens each item commits. Everything
        stays on the device until one copy of the step's sampled tokens (and accepted lengths) to the host."""
        inputs = self.runner.prepare(items)
        verify = [items[i] for i in inputs.verify]
        drafts = None
        if verify:
            if inputs.graph is not None and len(verify) == len(items) and self.dflash.graphs is not None:
                drafts = self.runner.graphs.replay_draft(inputs.graph[0])[: len(verify)]
            else:
                rows, starts, last = inputs.verify_inputs()
                drafts = self.dflash.propose(rows, starts, last, max(i.req.computed for i in verify))
            inputs.put_drafts(drafts)
        out = self.runner.forward(inputs)
        # Rows sampled per item: a verify block's every row; otherwise the last row, once the item's
        # pending tokens are all computed (a prompt chunk short of the end samples nothing).
        counts = [item.num_tokens if item.verify else int(item.num_tokens == item.req.pending) for item in items]
        owners = [item for item, n in zip(items, counts) for _ in range(n)]
        sampled = lengths = None
        if owners:
            rows = self._rows([off + item.num_tokens - n + j for item, off, n in zip(items, out.offsets, counts)
                               for j in range(n)], len(out.hidden))
            logits = self.runner.model.logits(out.hidden[rows])
            sampled = sample(logits, [o.req.params for o in owners], [o.req.generator for o in owners])
        if self.dflash is not None:
            self._write_plain_context([i for i in items if not i.verify], items, out)
        if verify:
            target = self._verify_rows(sampled, items, counts, inputs.verify).view(len(verify), -1)
            lengths = accept_lengths(drafts, target)
            if inputs.graph is not None and len(verify) == len(items) and self.dflash.graphs is not None:
                self.runner.graphs.replay_commit(inputs.graph[0], lengths)
            else:
                self._write_committed(verify, items, out, lengths)
        host = (sampled if lengths is None else torch.cat([sampled, lengths])).tolist() if owners else []
        committed_lens = host[len(owners):]
        results, at, k = [], 0, 0
        for item, n in zip(items, counts):
            tokens = host[at : at + n]
            at += n
            if item.verify:
                tokens = tokens[: committed_lens[k]]
                k += 1
                self._count_verify(item.req, len(tokens))
                item.req.computed += len(tokens)  # the block's first token and the accepted drafts
                self.scheduler.commit(item.req, item.req.computed)
            else:
                item.req.computed += item.num_tokens
                if item.req.computed - item.num_tokens < len(item.req.prompt_ids) <= item.req.computed:
                    self.scheduler.checkpoint(item.req)  # the prompt is computed: memd caches it now
            if self.trim_draft:
                self.scheduler.trim(item.req)
            results.append((item, tokens))
        return results

    def _rows(self, rows: list[int], total: int):
        """An index of hidden rows: a slice when it is all of them in order (a decode step), else a tensor."""
        if len(rows) == total and rows == list(range(total)):
            return slice(None)
        return self.runner.tensor(rows)

    def _verify_rows(self, sampled, items, counts, verify_idx):
        """The sampled target tokens of the verify items, [V * block]."""
        starts = [sum(counts[:i]) for i in verify_idx]
        rows = [s + j for s, i in zip(starts, verify_idx) for j in range(counts[i])]
        return sampled[self._rows(rows, len(sampled))]

    def _count_verify(self, req: Request, committed: int) -> None:
        req.spec_verify_ct += 1
        self.spec["spec_drafts"] += 1
        self.spec["spec_draft_tokens"] += self.dflash.block - 1
        self.spec["spec_accepted_tokens"] += committed - 1

    def _item_rows(self, chosen, items, out):
        offsets = {id(item): off for item, off in zip(items, out.offsets)}
        rows = [offsets[id(i)] + j for i in chosen for j in range(i.num_tokens)]
        return self._rows(rows, len(out.hidden))

    def _write_plain_context(self, plain, items, out: StepOutput) -> None:
        if plain:
            rows = self._item_rows(plain, items, out)
            self.dflash.write_context([c[rows] for c in out.captured], out.positions[rows], out.slots[rows])

    def _write_committed(self, verify, items, out: StepOutput, lengths: torch.Tensor) -> None:
        rows = self._item_rows(verify, items, out)
        slots_2d = out.slots[rows].reshape(len(verify), -1)
        self.dflash.write_committed([c[rows] for c in out.captured], out.positions[rows], slots_2d, lengths)

    def _append(self, req: Request, tokens: list[int]) -> None:
        """Commit tokens to the output, stopping at the first that finishes the request."""
        p = req.params
        for token in tokens:
            req.output_ids.append(token)
            if not p.ignore_eos and token in self.eos_ids:
                req.finish = Finish("stop")
            elif token in p.stop_token_ids:
                req.finish = Finish("stop", matched_stop=str(token))
            elif len(req.output_ids) >= p.max_new_tokens or len(req.all_ids) >= self.context_len:
                req.finish = Finish("length")
            if req.finish is not None:
                break
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
        with self.live_lock:
            self.live.pop(req.rid, None)
        req.events.put(("complete", req))

    def _fail_all(self, code: str, message: str, memd_alive: bool) -> None:
        for req in list(self.requests.values()):
            req.finish = Finish("abort", error_code=code, error=message)
            if not memd_alive:
                req.in_memd = False  # the lease of a lost session frees its slots in memd
            self._complete(req)
        if not memd_alive:
            self.scheduler.drop_releases()  # the lost session's slots are gone with it
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
