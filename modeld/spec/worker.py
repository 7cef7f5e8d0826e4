"""DFLASH speculative decoding over memd's pools: the draft block, the acceptance rule, and the
draft KV of committed tokens.

Per request, with L positions holding target K/V and the last committed token t (not yet
through the target):
  1. propose: the draft block [t, mask x (B-1)] at positions L..L+B-1 reads the draft KV
     context (its window, through the target->draft mapping) and predicts d_1..d_{B-1}
     (greedy: the one-hot draft).
  2. verify: the target runs [t, d_1..d_{B-1}] in one forward and yields a token y_i at every
     position (argmax, or a sample of the request's own distribution).
  3. accept: the longest prefix with d_i == y_{i-1}, then the bonus y_a. With a one-hot draft this
     is exactly speculative rejection sampling (accept d with probability p(d); on rejection the
     target's sample conditioned on != d is the residual), so the output distribution is the
     target's: lossless for greedy and for sampling alike.
  4. commit: positions L..L+a keep their target K/V (memd releases the rest of the block); their
     tapped hidden states become draft K/V at the translated draft slots (prefix-valid write).
     The block's own draft K/V is never stored.
"""

import torch

from modeld.kernels.accept import accept_lengths
from modeld.kernels.argmax import argmax_rows
from modeld.kernels.draft_attention import PagedContext
from modeld.kernels.kv_write import store_kv_prefix_valid, store_kv_translated
from modeld.model.causal_lm import CausalLM, ForwardBatch
from modeld.runner.inputs import StepInputs
from modeld.runner.model_runner import StepOutput
from modeld.spec.draft import DFlashDraft
from modeld.spec.graphs import SpecGraphs
from modeld.spec.serving_draft import ServingDraft


class DflashWorker:
    def __init__(self, draft: DFlashDraft, target: CausalLM, pools: dict[str, torch.Tensor]):
        self.draft = ServingDraft(draft, target.config.max_position_embeddings)
        self.target = target
        self.block = draft.spec.block_size
        self.taps = draft.spec.target_layer_ids
        # The acceptance rule (drafts, target tokens, live) -> committed lengths: the exact one. A benchmark may put a
        # simulated one here before the graphs are captured again (bench.common.simulated_acceptance); nothing on
        # modeld's command line or in a request reaches it.
        self.accept = accept_lengths
        self.graphs = None
        # On rank 0 of several tensor-parallel ranks, their group (modeld.engine.ranks.RankGroup): the draft's forward
        # and its K/V writes are announced first, so that every rank runs them over its own heads and pool.
        self.ranks = None
        self.bind(pools)

    def bind(self, pools: dict[str, torch.Tensor]) -> None:
        """memd's buffers (again after a re-attach: the draft's graphs read them, so they are captured again)."""
        self.draft_kv = pools["draft_kv"]  # [draft layers, 2, rows, kv_heads, head_dim]
        self.mapping = pools["target_to_draft"]
        self.req_to_token = pools["req_to_token"]
        if self.graphs is not None:
            self.graphs.capture(self)

    def use_graphs(self, target_graphs) -> None:
        """Propose through CUDA graphs of its own (modeld.spec.graphs) on verify steps that replay a target graph
        (a draft whose every layer slides, the kind memd's bounded draft pool serves)."""
        if None not in self.draft.spec.windows:
            self.graphs = SpecGraphs(target_graphs)
            self.graphs.capture(self)

    @property
    def graph_width(self) -> int:
        """The max_start a captured propose() passes: the widest window's context (the CPU's gather width; on the GPU
        the attention kernel reads each request's own range)."""
        return max(self.draft.spec.windows) - 1

    # ---- the speculative parts of one engine step --------------------------------------------------------------
    def verify_graphed(self, inputs: StepInputs) -> bool:
        """The step replays the target's verify graph with every item verifying: the worker's graphs serve it."""
        return self.graphs is not None and inputs.graph is not None and len(inputs.verify) == len(inputs.offsets)

    def cycle_steps(self, bucket: int) -> set[int]:
        """The counts of greedy verify steps one replay may run for this bucket."""
        return self.graphs.cycle_counts.get(bucket, set()) if self.graphs is not None else set()

    def _graphed_decode(self, inputs: StepInputs) -> bool:
        """The step replayed a one-token graph (every item decodes or is a one-token chunk): its context graph
        writes the draft K/V of every row."""
        return (
            self.graphs is not None
            and inputs.graph is not None
            and inputs.graph[1] == 1
            and inputs.graph[0] in self.graphs.context
        )

    def replay_greedy_cycles(self, inputs: StepInputs, k: int) -> torch.Tensor:
        """k whole verify steps of greedy requests from one graph (verify_graphed): [k, target tokens of every
        block row (bucket * B) | committed lengths (bucket)] on the device."""
        return self.graphs.replay_cycles(inputs.graph[0], k)

    def propose_into(self, inputs: StepInputs, max_start: int) -> torch.Tensor:
        """Proposes the verify items' drafts [V, B-1] and places them in the step's input ids."""
        if self.verify_graphed(inputs):
            drafts = self.graphs.replay_draft(inputs.graph[0])[: len(inputs.verify)]
        else:
            drafts = self.propose(*inputs.verify_inputs(), max_start=max_start)
        inputs.put_drafts(drafts)
        return drafts

    def after_forward(
        self, inputs: StepInputs, out: StepOutput, drafts: torch.Tensor | None, target: torch.Tensor | None
    ) -> torch.Tensor | None:
        """Draft K/V of what the target computed: every token of plain items, the committed prefix of each verified
        block (target: the target's tokens at the verify rows [V * B]). Returns the committed lengths [V]."""
        plain = [i for i in range(len(out.offsets)) if i not in set(inputs.verify)]
        if plain and self._graphed_decode(inputs):
            self.graphs.replay_context(inputs.graph[0])
        elif plain:
            rows = out.rows_of(plain)
            self.context_rows(out.captured, rows, out.positions[rows], out.slots[rows])
        if not inputs.verify:
            return None
        lengths = self.accept(drafts, target.view(len(inputs.verify), -1))
        if self.verify_graphed(inputs):
            self.graphs.replay_commit(inputs.graph[0], lengths)
        else:
            rows = out.rows_of(inputs.verify)
            slots_2d = out.slots[rows].reshape(len(inputs.verify), -1)
            self.committed_rows(out.captured, rows, out.positions[rows], slots_2d, lengths)
        return lengths

    def context_rows(self, captured: list[torch.Tensor], rows, positions, slots) -> None:
        """write_context of the given rows of a forward's taps (every rank: its own forward's taps)."""
        if self.ranks is not None:
            self.ranks.announce("context", rows, positions, slots)
        self.write_context([c[rows] for c in captured], positions, slots)

    def committed_rows(self, captured: list[torch.Tensor], rows, positions, slots_2d, lengths) -> None:
        """write_committed of the given rows of a forward's taps (every rank: its own forward's taps)."""
        if self.ranks is not None:
            self.ranks.announce("commit", rows, positions, slots_2d, lengths)
        self.write_committed([c[rows] for c in captured], positions, slots_2d, lengths)

    @torch.inference_mode()
    def greedy_cycle(self, batch: ForwardBatch, kv_pool: torch.Tensor) -> torch.Tensor:
        """A verify step of N greedy requests on the device alone (what the cycle graphs capture): the drafts into
        the block's ids, the target's forward, its argmax at every row, the committed lengths (0 for a padding
        request, whose slots are -1), the draft K/V of the committed prefixes. Returns [tokens (N * B), lengths (N)]."""
        n, b = len(batch.rows), self.block
        ids = batch.input_ids.view(n, b)
        drafts = self.propose(batch.rows, batch.q_starts, ids[:, 0], max_start=self.graph_width)
        ids[:, 1:].copy_(drafts)
        hidden, captured = self.target(batch, kv_pool, capture_layers=self.taps)
        target = argmax_rows(self.target.lm_head(hidden)).view(n, b)
        slots_2d = batch.out_slots.view(n, b)
        lengths = self.accept(drafts, target, live=slots_2d[:, 0])
        self.write_committed(captured, batch.positions, slots_2d, lengths)
        return torch.cat([target.reshape(-1), lengths])

    # ---- kernels of the parts -------------------------------------------------------------------------------
    @torch.inference_mode()
    def write_context(self, captured: list[torch.Tensor], positions: torch.Tensor, target_slots: torch.Tensor) -> None:
        """Draft K/V of tokens the target just computed (prefill, plain decode), at their
        translated draft slots; positions without a draft slot are skipped."""
        k, v = self.draft.context_kv_layers(torch.cat(captured, dim=-1), positions)
        store_kv_translated(self.draft_kv[:, 0], self.draft_kv[:, 1], target_slots, self.mapping, k, v)  # every layer

    @torch.inference_mode()
    def write_committed(self, captured_rows: list[torch.Tensor], positions, slots_2d, commit_lens) -> None:
        """Draft K/V of the committed prefix of each verified block: rows [N, B] of taps."""
        taps = torch.cat(captured_rows, dim=-1)  # [N * B, K * hidden]
        k, v = self.draft.context_kv_layers(taps, positions.reshape(-1))  # [N * B, layers, kv_heads, head_dim]
        store_kv_prefix_valid(
            self.draft_kv[:, 0], self.draft_kv[:, 1], slots_2d, commit_lens, k, v, mapping=self.mapping
        )  # every layer in one launch

    @torch.inference_mode()
    def propose(
        self, rows: torch.Tensor, starts: torch.Tensor, last_tokens: torch.Tensor, max_start: int
    ) -> torch.Tensor:
        """Greedy drafts d_1..d_{B-1} [N, B-1] on the device for N requests (rows of req_to_token, L, t). Each draft
        layer reads its context from the draft pool (PagedContext: on the GPU in the attention kernel itself, on the
        CPU through a gather). max_start, at least the largest L (known on the host), sizes the CPU's gather for a
        full-attention layer without a device sync; a sliding layer's is window - 1 positions (no L needs more). The
        argmax of the LM head's own logits is that of their fp32 values (exact): no fp32 copy of [N, B-1, vocab]."""
        return argmax_rows(self.target.lm_head(self.draft_hidden(rows, starts, last_tokens, max_start)[:, 1:]))

    @torch.inference_mode()
    def draft_hidden(
        self, rows: torch.Tensor, starts: torch.Tensor, last_tokens: torch.Tensor, max_start: int
    ) -> torch.Tensor:
        """The draft's final hidden states of the blocks [N, B, hidden] (propose's arguments)."""
        if self.ranks is not None:
            self.ranks.announce("propose", rows, starts, last_tokens, max_start)
        n, b = len(rows), self.block
        offsets = torch.arange(b, device=rows.device)
        positions = starts[:, None] + offsets  # [N, B]
        block_ids = torch.full((n, b), self.draft.spec.mask_token_id, dtype=torch.int64, device=rows.device)
        block_ids[:, 0] = last_tokens
        embeds = self.target.model.embed_tokens(block_ids)
        contexts = [
            PagedContext(
                self.draft_kv[i, 0],
                self.draft_kv[i, 1],
                self.req_to_token,
                self.mapping,
                rows,
                starts,
                window,
                max_start if window is None else window - 1,
            )
            for i, window in enumerate(self.draft.spec.windows)
        ]
        return self.draft.block_hidden(embeds, positions, contexts)
