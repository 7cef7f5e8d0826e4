"""Runs a scheduled step on the device and returns what each item commits. `run` packs the step's inputs on the
host (one copy to the device), then dispatches by the step's kind:

- greedy verify steps whose shape has graphs: whole DFLASH cycles, k of them in one replay (the spec worker's);
- decode steps the batch may run several of without the host: k greedy steps in one replay, else a decode chain;
- otherwise one step: the draft (DFLASH verify items), one target forward (a graph replay when the step has a
  captured shape, else eager), sampling, and acceptance; a plain decode step may queue the next one before its
  tokens are read (modeld.runner.steps_ahead).

Everything stays on the device until one copy of the step's tokens (and accepted lengths) to the host."""

from collections.abc import Callable
from dataclasses import dataclass
from itertools import accumulate

import numpy as np
import torch

from modeld.engine.hooks import EngineHooks
from modeld.engine.step_items import StepItem
from modeld.model.causal_lm import CausalLM, ForwardBatch
from modeld.request import TokenLogprob
from modeld.runner.graphs import GraphRunner
from modeld.runner.host_rules import HostRules
from modeld.runner.inputs import (
    DRAFT_AT,
    FIELDS,
    IDS,
    INDPTR,
    KV_LENS,
    LENS,
    POSITIONS,
    ROWS,
    SLOTS,
    STARTS,
    StepInputs,
    advances_on_device,
    row_index,
)
from modeld.runner.sampling import sample
from modeld.runner.steps_ahead import HostCopy, PendingStep, StepAhead, decode_chain


@dataclass
class StepOutput:
    hidden: torch.Tensor  # [T, hidden]: the final hidden state of every real token of the step
    captured: list[torch.Tensor]  # per tapped layer [T, hidden] (DFLASH)
    offsets: list[int]  # first row of each item in `hidden`
    q_lens: list[int]  # rows of each item
    positions: torch.Tensor  # [T]
    slots: torch.Tensor  # [T] target slots
    greedy: torch.Tensor | None = None  # [T] the argmax of every row, when a decode graph computed it

    def rows_of(self, chosen: list[int]) -> slice | torch.Tensor:
        """The token rows of the chosen items (indexes into the step's items), in order."""
        rows = [self.offsets[i] + j for i in chosen for j in range(self.q_lens[i])]
        return row_index(rows, len(self.hidden), self.hidden.device)


@dataclass(slots=True)
class ItemResult:
    """What one item of a step committed: its tokens in each device step the engine step ran, in order (a verify
    block's first token and accepted drafts; a decode's one token; a prompt chunk's sampled token, or none)."""

    item: StepItem
    steps: list[list[int]]
    logprobs: list[TokenLogprob] | None = None  # per committed token, when its request asked (one step only)

    @property
    def tokens(self) -> list[int]:
        return [token for step in self.steps for token in step]


def results(items: list[StepItem], per_item: list[list[list[int]]]) -> list[ItemResult]:
    return [ItemResult(item, steps) for item, steps in zip(items, per_item)]


class ModelRunner:
    def __init__(
        self,
        model: CausalLM,
        pools: dict[str, torch.Tensor],
        device: str,
        taps=(),
        graphs: GraphRunner | None = None,
        spec=None,
        overlap_decode: bool = False,
        hooks: EngineHooks | None = None,
    ):
        self.model = model
        self.hooks = hooks or EngineHooks()
        self.device = device
        self.taps = tuple(taps)
        self.graphs = graphs
        self.spec = spec  # the DFLASH worker (modeld.spec.worker), or None
        self.ahead = StepAhead(overlap_decode)  # a decode step queued before the last is committed
        self.bind(pools)

    def bind(self, pools: dict[str, torch.Tensor]) -> None:
        """memd's buffers (again after a re-attach: graphs read them, so they are captured again)."""
        self.kv_pool = pools["target_kv"]
        self.req_to_token = pools["req_to_token"]
        self.tables_written = pools.get("tables_written")  # memd's event (GPU); None: its writes are visible at once
        if self.graphs is not None:
            self.graphs.capture(self.model, self.kv_pool, self.req_to_token, self.taps)

    def tensor(self, values) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=self.device)

    def prepare(self, items: list[StepItem], block: int = 0) -> StepInputs:
        """Packs the step's inputs. A verify item's ids are its last committed token and `block - 1` placeholders
        that put_drafts fills on the device; every other item's ids are its request's next tokens. The step's kernels
        are queued after memd's table writes: every reply that granted its slots came before this call."""
        if self.tables_written is not None:
            torch.cuda.current_stream().wait_event(self.tables_written)
        q_lens = [item.num_tokens for item in items]
        graph = self.graphs.shape_for(q_lens) if self.graphs is not None else None
        n_tok, n_req = sum(q_lens), len(items)
        width = max(n_tok, n_req) if graph is None else graph[0] * graph[1]
        host = np.zeros((FIELDS, width), dtype=np.int64)
        # Plain lists, each field assigned once: per-item numpy slices cost more than the step at hundreds of requests.
        ids, positions, slots, starts, offsets, verify, draft_at = [], [], [], [], [], [], []
        for i, item in enumerate(items):
            req, n, start, at = item.req, item.num_tokens, item.req.computed, len(ids)
            offsets.append(at)
            starts.append(start)
            if item.verify:
                verify.append(i)
                ids.append(req.token_at(start))
                ids.extend([0] * (n - 1))
                draft_at.extend(range(at + 1, at + n))
            else:
                ids.extend(req.tokens(start, start + n))
            positions.extend(range(start, start + n))
            slots.extend(item.slots)
        host[IDS, :n_tok] = ids
        host[POSITIONS, :n_tok] = positions
        host[SLOTS, :n_tok] = slots
        host[ROWS, :n_req] = [item.row for item in items]
        host[STARTS, :n_req] = starts
        host[LENS, :n_req] = q_lens
        host[INDPTR, :n_req] = offsets
        host[DRAFT_AT, : len(draft_at)] = draft_at
        if graph is not None:  # padding: requests of row 0 (never used by memd), writing no K/V
            bucket, q = graph
            host[SLOTS, n_tok:] = -1
            host[LENS, n_req:bucket] = q
            host[INDPTR, n_req:bucket] = np.arange(n_req, bucket) * q
        host[KV_LENS] = host[STARTS] + host[LENS]
        dev = self.graphs.load(host) if graph is not None else torch.from_numpy(host).to(self.device, non_blocking=True)
        n_batch = graph[0] if graph is not None else n_req
        batch = ForwardBatch(
            input_ids=dev[IDS, : width if graph else n_tok],
            positions=dev[POSITIONS, : width if graph else n_tok],
            out_slots=dev[SLOTS, : width if graph else n_tok],
            rows=dev[ROWS, :n_batch],
            q_starts=dev[STARTS, :n_batch],
            q_lens=dev[LENS, :n_batch],
            kv_lens=dev[KV_LENS, :n_batch],
            req_to_token=self.req_to_token,
            qo_indptr=dev[INDPTR, :n_batch],
        )
        return StepInputs(batch, offsets, n_tok, dev[DRAFT_AT, : len(draft_at)], verify, graph, dev)

    def steps_ahead(self, items: list[StepItem], inputs: StepInputs) -> int:
        """Steps one engine step may run for this batch: 1, or more when the step replays a graph, every item steps
        on by its own output (advances_on_device) and every request holds the positions the steps can reach
        (modeld.runner.inputs' invariant). Verify steps run several only as greedy cycles."""
        if inputs.graph is None or not advances_on_device(items):
            return 1
        if inputs.verify and not all(item.req.params.greedy for item in items):
            return 1
        spare = min(item.req.held - item.req.computed for item in items)
        fused = self.spec.cycle_steps(inputs.graph[0]) if inputs.verify and self.spec is not None else None
        return self.graphs.steps_for(inputs.graph, len(items), spare, fused)

    # ---- one engine step ---------------------------------------------------------------------------------------
    def run(self, items: list[StepItem], may_queue_next: Callable[[], bool]) -> list[ItemResult]:
        """The step's tokens per item. `may_queue_next()`: whether the engine would plan the same batch one token
        further next (asked only of a plain decode step that could queue it)."""
        hooks = self.hooks
        hooks.enter("prepare")
        inputs = self.prepare(items)
        hooks.leave("prepare")
        greedy = all(item.req.params.greedy for item in items)
        ruled = any(item.req.params.host_rules for item in items)  # then one forward: each token through the host
        k = 1 if ruled else self.steps_ahead(items, inputs)
        if inputs.verify and greedy and not ruled and self.spec.verify_graphed(inputs):
            return self._greedy_cycles(items, inputs, k)
        if k > 1 and not inputs.verify:
            return self._decode_steps(items, inputs, k, greedy)
        return self._one_step(items, inputs, greedy, may_queue_next, ruled)

    def finish_pending(
        self, pending: PendingStep, items: list[StepItem], may_queue_next: Callable[[], bool]
    ) -> list[ItemResult]:
        """The tokens of the decode step queued ahead (`items`: its requests still running), after queueing the
        step after it when the batch goes on unchanged."""
        if len(items) == len(pending.items) and self.ahead.enabled and may_queue_next():
            self.hooks.enter("forward")
            self.ahead.queue_next(self, items, pending.inputs, pending.tokens)
            self.hooks.leave("forward")
        host = pending.copy.values()
        live = {id(item) for item in items}
        return results(items, [[[token]] for item, token in zip(pending.items, host) if id(item) in live])

    def _greedy_cycles(self, items: list[StepItem], inputs: StepInputs, k: int) -> list[ItemResult]:
        """k whole greedy verify steps in one graph: per step, its tokens, then its committed lengths."""
        block, width = self.spec.block, inputs.graph[0] * self.spec.block
        self.hooks.enter("forward")  # the drafts included
        cycles = self.spec.replay_greedy_cycles(inputs, k)
        self.hooks.leave("forward")
        host = cycles.tolist()
        return results(
            items, [[row[i * block : i * block + row[width + i]] for row in host] for i in range(len(items))]
        )

    def _decode_steps(self, items: list[StepItem], inputs: StepInputs, k: int, greedy: bool) -> list[ItemResult]:
        """k decode steps back to back: one graph of k greedy steps, else a chain of one-step replays."""
        self.hooks.enter("forward")  # a chain's sampling and draft context included
        if greedy and self.graphs.has_decode_steps(inputs.graph[0], k):
            steps = self.graphs.replay_decode_steps(inputs.graph[0], k)
        else:
            params = [item.req.params for item in items]
            steps = decode_chain(self, self.spec, inputs, params, [item.req.generator for item in items], k)
        self.hooks.leave("forward")
        host = steps.tolist()
        return results(items, [[[row[i]] for row in host] for i in range(len(items))])

    def _one_step(
        self,
        items: list[StepItem],
        inputs: StepInputs,
        greedy: bool,
        may_queue_next: Callable[[], bool],
        ruled: bool,
    ) -> list[ItemResult]:
        """The draft (verify items), one target forward, sampling (under the host rules of the requests that have
        them: modeld.runner.host_rules), acceptance."""
        verify, hooks = inputs.verify, self.hooks
        # Rows sampled per item: a verify block's every row; otherwise the last row, once the item's pending tokens
        # are all computed (a prompt chunk short of the end samples nothing).
        counts = [item.num_tokens if item.verify else int(item.num_tokens == item.req.pending) for item in items]
        owners = [item for item, n in zip(items, counts) for _ in range(n)]
        firsts = [0, *accumulate(counts)][:-1]  # each item's first sampled row
        rules = HostRules(items, counts, firsts) if ruled else None
        drafts = None
        if verify:
            hooks.enter("draft")
            drafts = self.spec.propose_into(inputs, max(items[i].req.computed for i in verify))
            if rules is not None:
                rules.copy_drafts(drafts)
            hooks.leave("draft")
        hooks.enter("forward")
        out = self.forward(inputs)
        hooks.leave("forward")
        sampled = logprobs = None
        hooks.enter("sample")
        if owners:
            rows = [off + item.num_tokens - n + j for item, off, n in zip(items, out.offsets, counts) for j in range(n)]
            picked = row_index(rows, len(out.hidden), out.hidden.device)
            if out.greedy is not None and greedy and rules is None:  # the decode graph took the argmax of every row
                sampled = out.greedy[picked]
            else:
                logits = self.model.logits(out.hidden[picked])
                if rules is not None:  # the masks are built on the host while the device computes the logits
                    drafts_host = rules.drafts_on_host()
                    hooks.enter("mask")
                    rules.build_masks(len(owners), logits.shape[1], drafts_host)
                    hooks.leave("mask")
                    logits = rules.mask(logits)
                sampled = sample(logits, [o.req.params for o in owners], [o.req.generator for o in owners])
                if rules is not None:
                    logprobs = rules.logprob_values(logits, sampled)
        hooks.leave("sample")
        lengths = None
        if self.spec is not None:
            verify_rows = [firsts[i] + j for i in verify for j in range(counts[i])]
            target = sampled[row_index(verify_rows, len(owners), sampled.device)] if verify else None
            lengths = self.spec.after_forward(inputs, out, drafts, target)
        extra = []
        if lengths is None and owners and rules is None and self.ahead.enabled and may_queue_next():
            copied = HostCopy.of(sampled)  # the next step, then these tokens
            hooks.enter("forward")
            self.ahead.queue_next(self, items, inputs, sampled)
            hooks.leave("forward")
            host = copied.values()
        elif logprobs is not None:  # the tokens (exact in float64) and their log probabilities in one copy
            payload = sampled if lengths is None else torch.cat([sampled, lengths])
            values = torch.cat([payload.double(), logprobs.reshape(-1)]).tolist()
            host, extra = [int(v) for v in values[: len(payload)]], values[len(payload) :]
        else:
            host = (sampled if lengths is None else torch.cat([sampled, lengths])).tolist() if owners else []
        committed_lens = iter(host[len(owners) :])
        committed = [
            host[first : first + n][: next(committed_lens) if item.verify else n]
            for item, n, first in zip(items, counts, firsts)
        ]
        if rules is None:
            return results(items, [[tokens] for tokens in committed])
        rules.advance(committed)
        per_item = rules.read_logprobs(extra, [len(tokens) for tokens in committed]) if extra else [None] * len(items)
        return [ItemResult(item, [tokens], lps) for item, tokens, lps in zip(items, committed, per_item)]

    def forward(self, inputs: StepInputs) -> StepOutput:
        """Computes (and stores) the K/V of every item's new tokens; returns the taps' outputs too."""
        b = inputs.batch
        greedy = None
        if inputs.graph is not None:
            hidden, captured, greedy = self.graphs.replay(inputs.graph)
        else:
            hidden, captured = self.model(b, self.kv_pool, capture_layers=self.taps)
        n = inputs.num_tokens
        q_lens = [nxt - off for off, nxt in zip(inputs.offsets, inputs.offsets[1:] + [n])]
        return StepOutput(
            hidden[:n],
            [c[:n] for c in captured],
            inputs.offsets,
            q_lens,
            b.positions[:n],
            b.out_slots[:n],
            None if greedy is None else greedy[:n],
        )
