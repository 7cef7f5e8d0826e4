"""The engine thread. Each pass is one step: plan (the scheduler's next batch, or the decode step already pending on
the device), run (modeld.runner.model_runner: inputs, draft, forward, sampling, acceptance), commit (each request's
computed position, memd's commits, checkpoints and draft trims), emit (output processing, modeld.engine.output: stop
rules, streaming; finished requests end). One thread owns all request state; other threads talk to it through
`submit` / `abort` and each request's queue. After each pass it hands the requests whose queues got events to
`listener` (one call a pass: in modeld's engine process, one message to the gRPC front)."""

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

import grpc
import torch

from modeld.engine import metrics
from modeld.engine.hooks import EngineHooks
from modeld.engine.memd_link import MemdLink
from modeld.engine.output import OutputProcessor
from modeld.engine.scheduler import Scheduler
from modeld.engine.step_items import StepItem
from modeld.grammar.matcher import MAX_MASK_SECONDS, RequestGrammar
from modeld.model.collectives import RankLost
from modeld.request import Finish, Request
from modeld.runner.model_runner import ItemResult, ModelRunner
from modeld.sampling_params import InvalidRequest

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
        spec_block: int = 0,
        trim_draft: bool = False,
        stream_interval: int = 1,
        hooks: EngineHooks | None = None,
        grammars=None,
    ):
        self.runner = runner
        self.grammars = grammars  # modeld.grammar.compiler.GrammarCompiler (None: the model has no tokenizer)
        self.compiling: dict[str, tuple[Request, Future]] = {}  # constrained requests before the scheduler sees them
        self.link = link
        self.spec_block = spec_block  # the DFLASH block verify steps run (0: no speculation)
        self.trim_draft = trim_draft  # bounded draft pool: ask memd to free out-of-window draft slots each step
        self.spec = {"spec_drafts": 0, "spec_draft_tokens": 0, "spec_accepted_tokens": 0}
        self.verifies_by_accepted = [0] * spec_block  # [a]: verifies accepting a drafts
        self.scheduler = scheduler
        self.hooks = hooks or EngineHooks()  # phase boundaries, for benchmarks and tests (no-ops by default)
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
                except RankLost as exc:  # no forward runs without every rank: fail what runs, and stop
                    log.critical("%s: the engine stops", exc)
                    self._fail_all("UNAVAILABLE", f"modeld lost a rank: {exc}", memd_alive=True)
                    self._deliver()
                    raise
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
                break
            if kind == "add":
                self.requests[value.rid] = value
                if value.params.constraint is None:
                    self.scheduler.add(value)
                else:
                    self._compile(value)
            elif value in self.requests:
                req = self.requests[value]
                req.finish = Finish("abort")
                self._complete(req)
        self._collect_compiled()

    def _compile(self, req: Request) -> None:
        """Starts compiling a request's constraint; the request waits for it outside the scheduler, holding nothing
        in memd, so a constraint that fails to compile is refused before any KV is allocated."""
        if self.grammars is None:
            req.finish = Finish("abort", error_code="INVALID_ARGUMENT", error="this model has no tokenizer: no grammar")
            self._complete(req)
            return
        future = self.grammars.submit(req.params.constraint)
        future.add_done_callback(lambda _: self.wake.set())
        self.compiling[req.rid] = (req, future)

    def _collect_compiled(self) -> None:
        """Requests whose constraint has compiled join the scheduler; those whose constraint is bad end with
        INVALID_ARGUMENT, saying what is wrong."""
        for rid, (req, future) in list(self.compiling.items()):
            if not future.done():
                continue
            del self.compiling[rid]
            try:
                req.grammar = RequestGrammar(future.result())
            except Exception as exc:
                if isinstance(exc, InvalidRequest):
                    req.finish = Finish("abort", error_code="INVALID_ARGUMENT", error=str(exc))
                else:  # the grammar engine itself failed (not installed, a bug): this request alone
                    log.exception("compiling a constraint failed")
                    req.finish = Finish("abort", error_code="INTERNAL", error=f"the grammar engine failed: {exc}")
                self._complete(req)
            else:
                self.scheduler.add(req)

    def _step(self) -> bool:
        """One pass: False when there was nothing to run."""
        started = time.perf_counter()
        self.hooks.enter("plan")
        pending = self.runner.ahead.take()
        if pending is None:
            items, hopeless = self.scheduler.next_step()
            for req in hopeless:
                self._complete(req)
        else:  # a request finished or aborted since that step was queued: its token there is dropped
            items = [item for item in pending.items if item.req.finish is None]
        self.hooks.leave("plan")
        if not items:
            if pending is None:
                self.scheduler.memd.release_idle()
                return False
            pending.copy.wait()  # the device is done with it before memd frees what it wrote
            return True
        self.hooks.enter("run")
        try:
            if pending is None:
                results = self.runner.run(items, lambda: self._follows(items))
            else:
                results = self.runner.finish_pending(pending, items, lambda: self._follows(items))
        except RankLost:
            raise
        except Exception as exc:  # a bug or a device error: fail the batch, keep serving
            log.exception("step failed")
            self.runner.ahead.drop()
            for item in items:
                item.req.finish = Finish("abort", error_code="INTERNAL", error=f"step failed: {exc}")
                self._complete(item.req)
            return True
        finally:
            self.hooks.leave("run")
        self.hooks.enter("commit")
        self._commit(results)
        self.hooks.leave("commit")
        self.hooks.committed(results)
        metrics.step_done(started, results)
        if self.scheduler.policy is not None:
            self._teach_policy(results, started)
        self.hooks.enter("emit")
        self._emit(results)
        self.hooks.leave("emit")
        return True

    def _follows(self, items: list[StepItem]) -> bool:
        """Whether the next pass would plan these items one token further (so that step may be queued now): nothing
        new arrived and the scheduler plans no change."""
        return self.inbox.empty() and self.scheduler.continues(items)

    def _commit(self, results: list[ItemResult]) -> None:
        """Advances every request by what its item computed in each step of the replay: memd commits a verify's
        accepted positions (it releases the rest of the block), caches a prompt once it is computed, and trims a
        bounded draft pool's out-of-window slots."""
        memd = self.scheduler.memd
        for result in results:
            item = result.item
            req, before = item.req, item.req.computed
            if item.verify:
                req.computed += len(result.tokens)  # each block's first token and its accepted drafts
                memd.commit(req, req.computed)
            else:
                req.computed += item.num_tokens * len(result.steps)
                if before < len(req.prompt_ids) <= req.computed:
                    memd.checkpoint(req)  # the prompt is computed: memd caches it now
            if self.trim_draft:
                memd.trim(req)

    def _teach_policy(self, results: list[ItemResult], started: float) -> None:
        """What this pass tells the speculation policy: each verify's committed tokens and, for a pass that only
        decoded, the seconds a step took with the option it ran (a pass with a prompt chunk measures neither)."""
        policy, verified = self.scheduler.policy, False
        for result in results:
            if result.item.verify:
                verified = True
                policy.accepted(result.item.req, [len(step) for step in result.steps])
        if all(result.item.verify or result.item.num_tokens == 1 for result in results):
            steps = max(len(result.steps) for result in results)
            policy.observe(self.scheduler.running, verified, time.perf_counter() - started, steps)
            metrics.SPEC_BLOCK.observe(self.spec_block if verified else 0)

    def _emit(self, results: list[ItemResult]) -> None:
        """The committed tokens into each request's output (stop rules, streaming); finished requests end."""
        for result in results:
            item, tokens = result.item, result.tokens
            before = len(item.req.output_ids)
            finished = bool(tokens) and self.output.append(item.req, tokens, result.logprobs)
            if not finished and item.req.grammar is not None and item.req.grammar.too_slow:
                self._end_slow_grammar(item.req)
                finished = True
            if tokens and item.req.stream:
                self.delivered.append(item.req)
            if item.verify:
                self._count_verifies(item.req, [len(step) for step in result.steps], len(item.req.output_ids) - before)
            elif self.spec_block and before:  # a decode that verified nothing (the prompt's token is not one)
                item.req.unverified_tokens += len(item.req.output_ids) - before
            if finished:
                self._complete(item.req)

    @staticmethod
    def _end_slow_grammar(req: Request) -> None:
        """A request whose grammar took too long to mask one step ends (its tokens so far were streamed)."""
        req.finish = Finish(
            "abort",
            error_code="RESOURCE_EXHAUSTED",
            error=f"the constraint's grammar took {1e3 * req.grammar.step_seconds:.0f} ms to mask one step, more "
            f"than {1e3 * MAX_MASK_SECONDS:.0f} ms (a simpler schema or regex may serve)",
        )

    def _count_verifies(self, req: Request, committed: list[int], output: int) -> None:
        """Counts the verified blocks whose tokens reached the output (`output` tokens did): a block a replay ran
        after its request finished is not one of its verifies."""
        for n in committed:
            if output <= 0:
                return
            output -= n
            req.spec_verify_ct += 1
            self.spec["spec_drafts"] += 1
            self.spec["spec_draft_tokens"] += self.spec_block - 1
            self.spec["spec_accepted_tokens"] += n - 1
            self.verifies_by_accepted[n - 1] += 1

    def _complete(self, req: Request) -> None:
        self.compiling.pop(req.rid, None)
        self.output.flush(req)  # an aborted request's tokens held back by the stream interval
        metrics.request_done(req)
        self.scheduler.remove(req)
        self.requests.pop(req.rid, None)
        with self.live_lock:
            self.live.pop(req.rid, None)
        req.events.put(("complete", req))
        self.delivered.append(req)

    def _fail_all(self, code: str, message: str, memd_alive: bool) -> None:
        self.runner.ahead.drop()  # before any release reaches memd
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
