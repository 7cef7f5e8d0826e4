"""The DFLASH worker's CUDA graphs, per batch bucket of verify steps (q = the block), captured through the target's
GraphRunner (its static inputs, memory pool and capture call) so that they read the same inputs a verify step's
target graph reads:

- draft: propose() for the verify items' rows, first positions and last tokens;
- commit: the draft K/V of the committed prefix of each verified block, from the verify graph's taps and
  `commit_lengths` (padding commits 0);
- cycles: k whole greedy verify steps (DflashWorker.greedy_cycle) back to back, each starting where the one before
  committed, so a greedy verify step is one replay and one copy of its tokens to the host;
- context: for decode steps of a batch too large to speculate, the draft context K/V of every row of the one-token
  forward graph; and the target's graphs of k greedy decode steps recaptured with that write as their side work.

Graphs capture memd's buffers by address: the worker recaptures them after the target's (a re-attach)."""

import torch

from modeld.runner.graphs import GraphRunner
from modeld.runner.inputs import IDS, POSITIONS, ROWS, SLOTS, STARTS, advance_inputs


class SpecGraphs:
    def __init__(self, target: GraphRunner):
        self.target = target
        self.draft: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.commit: dict[int, torch.cuda.CUDAGraph] = {}
        self.context: dict[int, torch.cuda.CUDAGraph] = {}
        # (bucket, k) -> (graph, [k, tokens of every block row (bucket * block) | committed lengths (bucket)])
        self.cycles: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.cycle_counts: dict[int, set[int]] = {}  # bucket -> the k with a cycles graph
        self.commit_lengths = torch.zeros(max(target.buckets), dtype=torch.int64, device=target.static.device)

    @torch.inference_mode()
    def capture(self, worker) -> None:
        """(Re)captures every graph of the worker over the target's last capture, largest bucket first."""
        block, g = worker.block, self.target
        for graphs in (self.draft, self.commit, self.context, self.cycles, self.cycle_counts):
            graphs.clear()
        if block not in g.tokens_per_request:
            return
        s = g.static
        with g.capturing():
            for bucket in reversed(g.buckets):
                verify_inputs = (
                    s[ROWS, :bucket],
                    s[STARTS, :bucket],
                    s[IDS, : bucket * block].view(bucket, block)[:, 0],
                )
                self.draft[bucket] = g.capture_steps(
                    bucket, block, lambda: worker.propose(*verify_inputs, max_start=worker.graph_width)
                )
                _, captured = g.forward_outputs(bucket, block)
                commit = (
                    captured,
                    s[POSITIONS, : bucket * block],
                    s[SLOTS, : bucket * block].view(bucket, block),
                    self.commit_lengths[:bucket],
                )
                self.commit[bucket] = g.capture_steps(bucket, block, lambda: worker.write_committed(*commit))[0]
                batch = g.batch(bucket, block)
                for k in [1, *g.repeats]:
                    self.cycles[(bucket, k)] = g.capture_steps(
                        bucket, block, lambda k=k: self._cycles(worker, batch, k)
                    )
                self.cycle_counts[bucket] = {1, *g.repeats}
                if 1 in g.tokens_per_request:
                    _, captured = g.forward_outputs(bucket, 1)
                    one = g.batch(bucket, 1)
                    self.context[bucket] = g.capture_steps(
                        bucket, 1, lambda: worker.write_context(captured, one.positions, one.out_slots)
                    )[0]
                    g.capture_decode_steps(bucket, worker.taps, worker.write_context)

    def _cycles(self, worker, batch, k: int) -> torch.Tensor:
        """k greedy verify steps of the batch in the static array, each starting where the one before committed:
        [k, tokens | lengths] as replay_cycles returns them."""
        bucket, block, static = len(batch.rows), worker.block, self.target.static
        out = torch.empty((k, bucket * block + bucket), dtype=torch.int64, device=static.device)
        for step in range(k):
            if step:
                lengths = out[step - 1, bucket * block :]
                tokens = out[step - 1, : bucket * block].view(bucket, block)
                last = tokens.gather(1, (lengths - 1).clamp(min=0)[:, None])
                advance_inputs(static, bucket, block, lengths, last[:, 0], batch.req_to_token)
            out[step] = worker.greedy_cycle(batch, self.target.pools[1])
        return out

    def replay_draft(self, bucket: int) -> torch.Tensor:
        """The drafts [bucket, block - 1] of a verify step whose inputs are in the static array."""
        graph, drafts = self.draft[bucket]
        graph.replay()
        return drafts

    def replay_commit(self, bucket: int, lengths: torch.Tensor) -> None:
        """Draft K/V of the committed prefix of each verified block of the last verify replay (padding commits 0)."""
        self.commit_lengths.zero_()
        self.commit_lengths[: len(lengths)] = lengths
        self.commit[bucket].replay()

    def replay_context(self, bucket: int) -> None:
        """Draft K/V of every row of the last replay of the (bucket, 1) forward graph (padding rows write none)."""
        self.context[bucket].replay()

    def replay_cycles(self, bucket: int, k: int) -> torch.Tensor:
        """k whole greedy verify steps whose first inputs are in the static array: [k, target tokens of every block
        row (bucket * block) | committed lengths (bucket; 0 for padding)]."""
        graph, out = self.cycles[(bucket, k)]
        graph.replay()
        return out
