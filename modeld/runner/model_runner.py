"""Turns a scheduled step into one forward over memd's pools: the step's inputs are packed on the host and
copied to the device in one transfer, and the forward replays a CUDA graph when the step has a captured shape
(every request decoding one token, or every request verifying one DFLASH block), else runs eagerly."""

from dataclasses import dataclass

import numpy as np
import torch

from modeld.engine.scheduler import StepItem
from modeld.model.causal_lm import CausalLM, ForwardBatch
from modeld.runner.graphs import GraphRunner
from modeld.runner.packed_inputs import DRAFT_AT, FIELDS, IDS, INDPTR, KV_LENS, LENS, POSITIONS, ROWS, SLOTS, STARTS


@dataclass
class StepInputs:
    batch: ForwardBatch
    offsets: list[int]  # first token of each item
    num_tokens: int  # real tokens (the batch may be padded to a graph's shape)
    draft_at: torch.Tensor  # [V * (block - 1)]: where the verify items' drafts go in input_ids
    verify: list[int]  # indexes of the verify items
    graph: tuple[int, int] | None  # (bucket, tokens per request) when a captured graph runs the step
    packed: torch.Tensor  # [fields, width] on the device: the batch's tensors are views of its rows

    def verify_inputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The verify items' req_to_token rows, first new positions and last committed tokens, on the device."""
        b, n = self.batch, len(self.verify)
        if n == len(self.offsets):  # every item verifies a block: the common step, read in place
            block = self.num_tokens // n
            return b.rows[:n], b.q_starts[:n], b.input_ids[: n * block].view(n, block)[:, 0]
        idx = torch.tensor(self.verify, dtype=torch.int64, device=b.rows.device)
        firsts = torch.tensor([self.offsets[i] for i in self.verify], dtype=torch.int64, device=b.rows.device)
        return b.rows[idx], b.q_starts[idx], b.input_ids[firsts]

    def put_drafts(self, drafts: torch.Tensor) -> None:
        """The proposed drafts [V, block - 1] (on the device) into the verify items' input ids."""
        self.batch.input_ids.index_copy_(0, self.draft_at, drafts.reshape(-1))


def advances_on_device(items: list[StepItem]) -> bool:
    """Whether the step after this one is each item's own output fed back, as modeld.runner.step_advance makes it on the
    device: every item a verify block, or one token that samples (a decode, or a prompt's last token). A prompt
    chunk of several tokens is neither, even one as long as a DFLASH block (whose verify graph it replays)."""
    return all(item.verify or item.num_tokens == 1 == item.req.pending for item in items)


def row_index(rows: list[int], total: int, device) -> slice | torch.Tensor:
    """An index of `rows` out of `total`: a slice when it is all of them in order (no copy to the device)."""
    if len(rows) == total and rows == list(range(total)):
        return slice(None)
    return torch.tensor(rows, dtype=torch.int64, device=device)


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


class ModelRunner:
    def __init__(
        self, model: CausalLM, pools: dict[str, torch.Tensor], device: str, taps=(), graphs: GraphRunner | None = None
    ):
        self.model = model
        self.device = device
        self.taps = tuple(taps)
        self.graphs = graphs
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
        (modeld.runner.step_advance's invariant). Verify steps run several only as greedy cycles."""
        if inputs.graph is None or not advances_on_device(items):
            return 1
        if inputs.verify and not all(item.req.params.greedy for item in items):
            return 1
        return self.graphs.steps_for(inputs.graph, len(items), min(item.req.held - item.req.computed for item in items))

    def has_decode_steps(self, inputs: StepInputs, k: int) -> bool:
        """Whether one graph runs k greedy decode steps of the prepared batch."""
        return inputs.graph is not None and self.graphs.has_decode_steps(inputs.graph[0], k)

    def replay_decode_steps(self, inputs: StepInputs, k: int) -> torch.Tensor:
        """k greedy decode steps of the prepared batch in one replay: the argmax of each [k, bucket]."""
        return self.graphs.replay_decode_steps(inputs.graph[0], k)

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
