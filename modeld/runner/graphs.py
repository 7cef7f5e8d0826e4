"""CUDA graphs of the target forward for the shapes decoding repeats every step: B requests of q tokens each,
q = 1 (plain decode) or q = the DFLASH block (verify), B padded up to a bucket; and one request's prompt chunk of
up to 128 tokens, padded up to 16, 32, 64 or 128 (an eager forward of a short prompt was mostly kernel launches:
about 16 ms of a batch-1 request's first tokens on an H100, bench.engine.step_span).

A graph reads its inputs from one static device array (the rows of modeld.runner.model_runner's packed inputs), written by one
host->device copy per step, so nothing per step is frozen at capture: token ids, positions, slots, request rows,
lengths and offsets are all data. Padding requests use row 0 of req_to_token, which memd never hands out (its
entries are 0, the sink slot), and slot -1, which writes no K/V. A prompt chunk's padding rows (past its length)
write no K/V either (slot -1), and attention stores nothing for them; every other op is row by row, so the real
rows compute what the eager forward does, and the step reads only those. Graphs capture memd's buffers by address,
so they are captured again whenever modeld maps new pools (a re-attach). Triton kernels are compiled by one eager run of
each shape before its capture.

Greedy steps need no logits on the host side: a decode graph also takes the argmax of every row (the LM head's bf16
logits: their argmax is that of their exact fp32 values), and with DFLASH a "greedy cycle" graph per bucket runs a
whole verify step (draft, target, argmax, acceptance, draft K/V of the committed prefixes), so such a step is one
replay and one copy of its tokens to the host. Greedy batches also have graphs of k such steps back to back (k in
`repeats`: powers of two up to --steps-per-replay), each step's inputs made on the device from the one before
(modeld.runner.step_advance): the host's work and the replay's launch are paid once per k steps (decode steps from 16
running, verify steps at every batch size). With DFLASH, the k decode steps of a batch too large to speculate
also write the draft's context K/V of each step's tokens inside the graph (captured with the draft's graphs), on a
second stream beside the next step's forward, joined before the graph ends.
"""

import logging
import time

import numpy as np
import torch

from modeld.engine.tuning import PROMPT_TOKENS, Tuning
from modeld.kernels.argmax import argmax_rows
from modeld.model.causal_lm import CausalLM, ForwardBatch
from modeld.runner.packed_inputs import IDS, INDPTR, KV_LENS, LENS, POSITIONS, ROWS, SLOTS, STARTS
from modeld.runner.step_advance import advance_inputs

log = logging.getLogger("modeld")


def batch_buckets(max_requests: int) -> list[int]:
    """Batch sizes with a graph: 1, 2, 4, 8, then every 8 up to 64, every 16 up to 256, every 32 beyond."""
    sizes = [1, 2, 4, 8] + list(range(16, 65, 8)) + list(range(80, 257, 16)) + list(range(288, max_requests + 1, 32))
    return sorted({s for s in sizes if s < max_requests} | {max_requests})


def lone_sizes(tokens_per_request: tuple[int, ...]) -> list[int]:
    """q of the graphs that run one request's prompt chunk: PROMPT_TOKENS, and a verify block's size (whose graphs
    are the verify graphs)."""
    return sorted({*PROMPT_TOKENS, *(q for q in tokens_per_request if q > 1)})


def graph_shape(
    q_lens: list[int], buckets: list[int], tokens_per_request: tuple[int, ...], lone_tokens: list[int]
) -> tuple[int, int] | None:
    """(bucket, q) of the graph that runs requests of these token counts, or None (eager): for one request of several
    tokens, the smallest graph of one request (of `lone_tokens`) that holds them; else requests of one token count in
    `tokens_per_request`, in the smallest bucket that holds them."""
    if len(q_lens) == 1 and q_lens[0] > 1:
        q = next((q for q in lone_tokens if q >= q_lens[0]), None)
        return None if q is None else (1, q)
    if not q_lens or len(set(q_lens)) != 1 or q_lens[0] not in tokens_per_request:
        return None
    bucket = next((b for b in buckets if b >= len(q_lens)), None)
    return None if bucket is None else (bucket, q_lens[0])


def replay_repeats(steps_per_replay: int) -> list[int]:
    """Step counts (beyond 1) with graphs of several steps: the powers of two below steps_per_replay, and it."""
    if steps_per_replay <= 1:
        return []
    return sorted(
        {2**i for i in range(1, steps_per_replay.bit_length()) if 2**i < steps_per_replay} | {steps_per_replay}
    )


class GraphRunner:
    def __init__(
        self,
        max_requests: int,
        tokens_per_request: tuple[int, ...],
        fields: int,
        device: str,
        steps_per_replay: int = 1,
        several_from: int = Tuning.several_steps_from_batch,
        cycles_from: int = Tuning.several_cycles_from_batch,
    ):
        self.buckets = batch_buckets(max_requests)
        self.tokens_per_request = tokens_per_request
        self.lone_tokens = lone_sizes(tokens_per_request)  # q of the graphs of one request's prompt chunk
        self.repeats = replay_repeats(steps_per_replay)
        self.several_from = several_from  # smaller batches run one decode step a replay
        self.cycles_from = cycles_from  # smaller batches run one greedy verify step a replay
        width = max(max_requests * max(tokens_per_request), max(self.lone_tokens))
        self.static = torch.zeros((fields, width), dtype=torch.int64, device=device)
        self.staging = torch.zeros((fields, width), dtype=torch.int64).pin_memory()
        # (bucket, q) -> (graph, hidden, taps, argmax of every row (decode graphs; None for q > 1))
        self.graphs: dict[
            tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor, list[torch.Tensor], torch.Tensor | None]
        ] = {}
        self.draft_graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.commit_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.context_graphs: dict[int, torch.cuda.CUDAGraph] = {}  # bucket -> the draft context of a decode replay
        # (bucket, k) -> (graph, [k, tokens of every block row (bucket * block) | committed lengths (bucket)])
        self.cycle_graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.decode_steps: dict[
            tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]
        ] = {}  # k > 1: [k, bucket] argmax
        self.pools = None  # (kv_pool, req_to_token) of the last capture: the greedy cycles' target pools
        # the draft context writes of k decode steps in one graph, beside the next step's forward (_decode_steps)
        self.context_stream = torch.cuda.Stream(device=device)
        self.commit_lengths = torch.zeros(max_requests, dtype=torch.int64, device=device)
        self.pool = None

    def shape_for(self, q_lens: list[int]) -> tuple[int, int] | None:
        """(bucket, q) of the graph that runs requests of these token counts, or None (eager)."""
        return graph_shape(q_lens, self.buckets, self.tokens_per_request, self.lone_tokens)

    def steps_for(self, shape: tuple[int, int], requests: int, spare: int) -> int:
        """Steps one engine step runs for a batch of `requests` in this (bucket, q) whose every request holds at
        least `spare` positions beyond what it computed: the most whose k steps reach no further (k * q <= spare),
        for verify steps only with a graph of k greedy cycles (decode steps without a fused graph of k run as a
        chain of one-step replays: modeld.runner.decode_chain); 1 for a batch smaller than `several_from` (decode steps) or
        `cycles_from` (verify steps)."""
        bucket, q = shape
        if requests < (self.several_from if q == 1 else self.cycles_from):
            return 1
        fused = (lambda k: True) if q == 1 else (lambda k: (bucket, k) in self.cycle_graphs)
        return max([k for k in self.repeats if k * q <= spare and fused(k)], default=1)

    def has_decode_steps(self, bucket: int, k: int) -> bool:
        """Whether one graph runs k greedy decode steps of this bucket (with DFLASH, writing the draft's context)."""
        return (bucket, k) in self.decode_steps

    def load(self, host: np.ndarray) -> torch.Tensor:
        """Copies a step's packed inputs [fields, width] into the static array; returns the array. The staging
        buffer is reused: the engine reads the step's tokens (a sync) before it packs the next step."""
        width = host.shape[1]
        self.staging[:, :width].numpy()[:] = host
        self.static[:, :width].copy_(self.staging[:, :width], non_blocking=True)
        return self.static

    def replay_draft(self, bucket: int) -> torch.Tensor:
        """The DFLASH drafts [bucket, block - 1] of a verify step whose inputs are in the static array."""
        graph, drafts = self.draft_graphs[bucket]
        graph.replay()
        return drafts

    def replay_commit(self, bucket: int, lengths: torch.Tensor) -> None:
        """Draft K/V of the committed prefix of each verified block of the last verify replay (padding commits 0)."""
        self.commit_lengths.zero_()
        self.commit_lengths[: len(lengths)] = lengths
        self.commit_graphs[bucket].replay()

    def replay_context(self, bucket: int) -> None:
        """Draft K/V of every row of the last replay of the (bucket, 1) decode graph (padding rows write none)."""
        self.context_graphs[bucket].replay()

    def replay_cycles(self, bucket: int, k: int) -> torch.Tensor:
        """k whole greedy verify steps whose first inputs are in the static array: [k, target tokens of every block
        row (bucket * block) | committed lengths (bucket; 0 for padding)]."""
        graph, out = self.cycle_graphs[(bucket, k)]
        graph.replay()
        return out

    def replay_decode_steps(self, bucket: int, k: int) -> torch.Tensor:
        """k greedy decode steps whose first inputs are in the static array: the argmax of every row [k, bucket]."""
        graph, out = self.decode_steps[(bucket, k)]
        graph.replay()
        return out

    def replay(self, shape: tuple[int, int]) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor | None]:
        graph, hidden, captured, greedy = self.graphs[shape]
        graph.replay()
        return hidden, captured, greedy

    def _batch(self, bucket: int, q: int, req_to_token: torch.Tensor) -> ForwardBatch:
        s, n = self.static, bucket * q
        return ForwardBatch(
            input_ids=s[IDS, :n],
            positions=s[POSITIONS, :n],
            out_slots=s[SLOTS, :n],
            rows=s[ROWS, :bucket],
            q_starts=s[STARTS, :bucket],
            q_lens=s[LENS, :bucket],
            kv_lens=s[KV_LENS, :bucket],
            req_to_token=req_to_token,
            qo_indptr=s[INDPTR, :bucket],
        )

    def _pad_inputs(self, bucket: int, q: int) -> None:
        """Every request a padding request: a warm-up or capture run writes no K/V."""
        self.static.zero_()
        self.static[SLOTS].fill_(-1)
        self.static[LENS, :bucket] = q
        self.static[KV_LENS, :bucket] = q
        self.static[INDPTR, :bucket] = torch.arange(bucket, device=self.static.device) * q

    @torch.inference_mode()
    def capture(self, model: CausalLM, kv_pool: torch.Tensor, req_to_token: torch.Tensor, taps=()) -> None:
        """(Re)captures every (bucket, q) graph over these pools, largest first, in one shared memory pool."""
        began = time.monotonic()
        self.graphs.clear()
        self.decode_steps.clear()
        self.pools = (kv_pool, req_to_token)
        self.pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            forward = (stream, model, kv_pool, req_to_token, taps)
            for q in self.tokens_per_request:
                for bucket in reversed(self.buckets):
                    self.graphs[(bucket, q)] = self._capture_forward(*forward, bucket, q)
            for q in (q for q in self.lone_tokens if q not in self.tokens_per_request):  # one request's prompt chunk
                self.graphs[(1, q)] = self._capture_forward(*forward, 1, q)
            for k in self.repeats if 1 in self.tokens_per_request and not taps else ():
                for bucket in reversed(self.buckets):
                    batch = self._batch(bucket, 1, req_to_token)
                    self.decode_steps[(bucket, k)] = self._capture(
                        stream, bucket, 1, lambda: self._decode_steps(model, batch, kv_pool, req_to_token, k)
                    )
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        log.info(
            "captured %d CUDA graphs (batch buckets %s, tokens per request %s, steps per replay %s) in %.1f s",
            len(self.graphs) + len(self.decode_steps),
            self.buckets,
            list(self.tokens_per_request),
            [1, *self.repeats],
            time.monotonic() - began,
        )

    def _capture_forward(self, stream, model: CausalLM, kv_pool, req_to_token, taps, bucket: int, q: int):
        """(graph, hidden, taps' outputs, argmax of every row (q = 1; else None)) of one forward of `bucket` padding
        requests of q tokens, after one eager run that compiles the Triton kernels of this shape."""
        self._pad_inputs(bucket, q)
        batch = self._batch(bucket, q, req_to_token)
        model(batch, kv_pool, capture_layers=taps)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=stream):
            hidden, captured = model(batch, kv_pool, capture_layers=taps)
            greedy = argmax_rows(model.lm_head(hidden)) if q == 1 else None
        return graph, hidden, captured, greedy

    def _capture(self, stream, bucket: int, q: int, steps) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """A graph of `steps()` over padding requests (they write no K/V and commit nothing), after one eager run
        (kernels chosen and loaded); the inputs are padding again at capture (the eager run advanced them)."""
        self._pad_inputs(bucket, q)
        steps()
        self._pad_inputs(bucket, q)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=stream):
            out = steps()
        return graph, out

    def _decode_steps(
        self, model: CausalLM, batch: ForwardBatch, kv_pool, req_to_token, k: int, worker=None
    ) -> torch.Tensor:
        """k greedy decode steps of the batch in the static array, each fed the argmax of the one before: [k, bucket].
        With a DFLASH worker, each step also writes the draft's context K/V of its tokens (padding: slot -1, none),
        on a stream of its own beside the next step's forward (nothing in a decode step reads the draft pool): the
        write waits for its step's taps, and the steps' end waits for every write."""
        bucket = len(batch.rows)
        ones = torch.ones(bucket, dtype=torch.int64, device=self.static.device)
        out = torch.empty((k, bucket), dtype=torch.int64, device=self.static.device)
        main = torch.cuda.current_stream()
        # What the side stream's writes read, alive until the join: no later step's allocation reuses it meanwhile.
        held = []
        for step in range(k):
            if step:
                advance_inputs(self.static, bucket, 1, ones, out[step - 1], req_to_token)
            hidden, captured = model(batch, kv_pool, capture_layers=() if worker is None else worker.taps)
            if worker is not None:
                # this step's positions and slots (rows POSITIONS, SLOTS): the next step's advance rewrites them
                where = self.static[POSITIONS : SLOTS + 1, :bucket].clone()
                self.context_stream.wait_stream(main)
                with torch.cuda.stream(self.context_stream):
                    worker.write_context(captured, where[0], where[1])
                held.append((captured, where))
            out[step] = argmax_rows(model.lm_head(hidden))
        if held:
            main.wait_stream(self.context_stream)
        return out

    def _cycles(self, worker, batch: ForwardBatch, kv_pool, req_to_token, k: int) -> torch.Tensor:
        """k greedy verify steps (DflashWorker.greedy_cycle) of the batch in the static array, each starting where
        the one before committed: [k, tokens | lengths] as replay_cycles returns them."""
        bucket, block = len(batch.rows), worker.block
        out = torch.empty((k, bucket * block + bucket), dtype=torch.int64, device=self.static.device)
        for step in range(k):
            if step:
                lengths = out[step - 1, bucket * block :]
                last = (
                    out[step - 1, : bucket * block].view(bucket, block).gather(1, (lengths - 1).clamp(min=0)[:, None])
                )
                advance_inputs(self.static, bucket, block, lengths, last[:, 0], req_to_token)
            out[step] = worker.greedy_cycle(batch, kv_pool)
        return out

    @torch.inference_mode()
    def capture_draft(self, worker) -> None:
        """(Re)captures the DFLASH draft's propose() per batch bucket of verify steps (q = the block), reading the
        verify items' rows, first positions and last tokens from the static array as the target's graph does; and
        the draft K/V write of the committed prefixes, reading the verify graph's taps and `commit_lengths`; and the
        greedy cycle (worker.greedy_cycle) over the target of the last capture; and, for decode steps (a batch too
        large to speculate), the draft context K/V write of a one-step replay, reading its taps, and k greedy decode
        steps that write it."""
        block = worker.block
        if block not in self.tokens_per_request:
            return
        self.draft_graphs.clear()
        self.commit_graphs.clear()
        self.cycle_graphs.clear()
        self.context_graphs.clear()
        kv_pool, req_to_token = self.pools
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for bucket in reversed(self.buckets):
                self._pad_inputs(bucket, block)
                s = self.static
                args = (s[ROWS, :bucket], s[STARTS, :bucket], s[IDS, : bucket * block].view(bucket, block)[:, 0])
                worker.propose(*args, max_start=worker.graph_width)  # warm-up: kernels chosen and loaded
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool, stream=stream):
                    drafts = worker.propose(*args, max_start=worker.graph_width)
                self.draft_graphs[bucket] = (graph, drafts)
                _, _, captured, _ = self.graphs[(bucket, block)]
                commit = (
                    captured,
                    s[POSITIONS, : bucket * block],
                    s[SLOTS, : bucket * block].view(bucket, block),
                    self.commit_lengths[:bucket],
                )
                worker.write_committed(*commit)  # padding: every length 0, nothing is written
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool, stream=stream):
                    worker.write_committed(*commit)
                self.commit_graphs[bucket] = graph
                batch = self._batch(bucket, block, req_to_token)
                for k in [1, *self.repeats]:
                    self.cycle_graphs[(bucket, k)] = self._capture(
                        stream, bucket, block, lambda: self._cycles(worker, batch, kv_pool, req_to_token, k)
                    )
                if 1 in self.tokens_per_request:
                    _, _, captured, _ = self.graphs[(bucket, 1)]
                    batch = self._batch(bucket, 1, req_to_token)
                    self.context_graphs[bucket] = self._capture(
                        stream, bucket, 1, lambda: worker.write_context(captured, batch.positions, batch.out_slots)
                    )[0]
                    for k in self.repeats:
                        self.decode_steps[(bucket, k)] = self._capture(
                            stream,
                            bucket,
                            1,
                            lambda: self._decode_steps(worker.target, batch, kv_pool, req_to_token, k, worker),
                        )
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
