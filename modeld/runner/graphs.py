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
logits: their argmax is that of their exact fp32 values). Greedy batches also have graphs of k decode steps back to
back (k in `repeats`: powers of two up to Tuning.steps_per_replay), each step's inputs made on the device from the
one before (modeld.runner.inputs.advance_inputs): the host's work and the replay's launch are paid once per k steps.
Such a graph may run side work after each step on a stream of its own, beside the next step's forward (with DFLASH:
the draft's context K/V of the step's tokens).

The runner knows the target alone. Other graphs over the same static inputs and memory pool (the DFLASH worker's
draft, commit and cycle graphs: modeld.spec.graphs) are captured through `capture_steps` inside `capturing()`.
"""

import contextlib
import gc
import logging
import time

import numpy as np
import torch

from modeld.engine.tuning import PROMPT_TOKENS, Tuning
from modeld.kernels.argmax import argmax_rows
from modeld.model.causal_lm import CausalLM, ForwardBatch
from modeld.runner.inputs import IDS, INDPTR, KV_LENS, LENS, POSITIONS, ROWS, SLOTS, STARTS, advance_inputs

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
        # (bucket, k > 1) -> (graph, [k, bucket] argmax) of k greedy decode steps
        self.decode_steps: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pools = None  # (model, kv_pool, req_to_token) of the last capture
        self.side_stream = torch.cuda.Stream(device=device)  # side work of k decode steps in one graph
        self.pool = None
        self.stream = None  # the capture stream, inside capturing()

    def shape_for(self, q_lens: list[int]) -> tuple[int, int] | None:
        """(bucket, q) of the graph that runs requests of these token counts, or None (eager)."""
        return graph_shape(q_lens, self.buckets, self.tokens_per_request, self.lone_tokens)

    def steps_for(self, shape: tuple[int, int], requests: int, spare: int, fused: set[int] | None = None) -> int:
        """Steps one engine step runs for a batch of `requests` in this (bucket, q) whose every request holds at
        least `spare` positions beyond what it computed: the most whose k steps reach no further (k * q <= spare),
        and for steps of several tokens (verify blocks) only a k in `fused`, the step counts with a graph of their
        own (decode steps without a fused graph of k run as a chain of one-step replays: modeld.runner.steps_ahead);
        1 for a batch smaller than `several_from` (decode steps) or `cycles_from` (verify steps)."""
        q = shape[1]
        if requests < (self.several_from if q == 1 else self.cycles_from):
            return 1
        return max([k for k in self.repeats if k * q <= spare and (q == 1 or k in (fused or ()))], default=1)

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

    def replay_decode_steps(self, bucket: int, k: int) -> torch.Tensor:
        """k greedy decode steps whose first inputs are in the static array: the argmax of every row [k, bucket]."""
        graph, out = self.decode_steps[(bucket, k)]
        graph.replay()
        return out

    def replay(self, shape: tuple[int, int]) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor | None]:
        graph, hidden, captured, greedy = self.graphs[shape]
        graph.replay()
        return hidden, captured, greedy

    def batch(self, bucket: int, q: int) -> ForwardBatch:
        """The forward batch of `bucket` requests of q tokens each whose inputs are the static array's rows."""
        s, n = self.static, bucket * q
        return ForwardBatch(
            input_ids=s[IDS, :n],
            positions=s[POSITIONS, :n],
            out_slots=s[SLOTS, :n],
            rows=s[ROWS, :bucket],
            q_starts=s[STARTS, :bucket],
            q_lens=s[LENS, :bucket],
            kv_lens=s[KV_LENS, :bucket],
            req_to_token=self.pools[2],
            qo_indptr=s[INDPTR, :bucket],
        )

    def pad_inputs(self, bucket: int, q: int) -> None:
        """Every request a padding request: a warm-up or capture run writes no K/V."""
        self.static.zero_()
        self.static[SLOTS].fill_(-1)
        self.static[LENS, :bucket] = q
        self.static[KV_LENS, :bucket] = q
        self.static[INDPTR, :bucket] = torch.arange(bucket, device=self.static.device) * q

    def forward_outputs(self, bucket: int, q: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The hidden states and taps' outputs the (bucket, q) forward graph writes: later graphs may read them."""
        _, hidden, captured, _ = self.graphs[(bucket, q)]
        return hidden, captured

    @contextlib.contextmanager
    def capturing(self):
        """The stream capture_steps captures on, joined with the current stream (and synchronised) afterwards. The
        garbage collector is off meanwhile (after one collection): an unreachable CUDA graph it freed mid-capture
        would break the capture."""
        collecting = gc.isenabled()
        gc.collect()
        gc.disable()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        self.stream = stream
        try:
            with torch.cuda.stream(stream):
                yield
        finally:
            self.stream = None
            torch.cuda.current_stream().wait_stream(stream)
            torch.cuda.synchronize()
            if collecting:
                gc.enable()

    def capture_steps(self, bucket: int, q: int, steps) -> tuple[torch.cuda.CUDAGraph, object]:
        """A graph of `steps()` over `bucket` padding requests of q tokens (they write no K/V and commit nothing), in
        the shared memory pool, after one eager run (kernels chosen and loaded); the inputs are padding again at
        capture (the eager run may have advanced them). Inside capturing(). Returns the graph and what steps()
        returned at capture (tensors the replays write)."""
        self.pad_inputs(bucket, q)
        steps()
        self.pad_inputs(bucket, q)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
            out = steps()
        return graph, out

    @torch.inference_mode()
    def capture(self, model: CausalLM, kv_pool: torch.Tensor, req_to_token: torch.Tensor, taps=()) -> None:
        """(Re)captures every (bucket, q) forward graph over these pools, largest first, in one shared memory pool;
        and, for a target without taps, its graphs of k greedy decode steps (a target with taps has them captured
        with the side work its taps feed: capture_decode_steps)."""
        began = time.monotonic()
        self.graphs.clear()
        self.decode_steps.clear()
        self.pools = (model, kv_pool, req_to_token)
        self.pool = torch.cuda.graph_pool_handle()
        with self.capturing():
            for q in self.tokens_per_request:
                for bucket in reversed(self.buckets):
                    self.graphs[(bucket, q)] = self._capture_forward(taps, bucket, q)
            for q in (q for q in self.lone_tokens if q not in self.tokens_per_request):  # one request's prompt chunk
                self.graphs[(1, q)] = self._capture_forward(taps, 1, q)
            if 1 in self.tokens_per_request and not taps:
                for bucket in reversed(self.buckets):
                    self.capture_decode_steps(bucket)
        log.info(
            "captured %d CUDA graphs (batch buckets %s, tokens per request %s, steps per replay %s) in %.1f s",
            len(self.graphs) + len(self.decode_steps),
            self.buckets,
            list(self.tokens_per_request),
            [1, *self.repeats],
            time.monotonic() - began,
        )

    def capture_decode_steps(self, bucket: int, taps=(), side=None) -> None:
        """(Re)captures this bucket's graphs of k greedy decode steps (k in `repeats`). With side(taps' outputs,
        positions, slots), each step also runs it on the side stream beside the next step's forward (nothing in a
        decode step may read what it writes). Inside capturing()."""
        model, kv_pool, _ = self.pools
        batch = self.batch(bucket, 1)
        for k in self.repeats:
            self.decode_steps[(bucket, k)] = self.capture_steps(
                bucket, 1, lambda k=k: self._decode_steps(model, batch, kv_pool, k, taps, side)
            )

    def _capture_forward(self, taps, bucket: int, q: int):
        """(graph, hidden, taps' outputs, argmax of every row (q = 1; else None)) of one forward of `bucket` padding
        requests of q tokens, after one eager run that compiles the Triton kernels of this shape."""
        model, kv_pool, _ = self.pools
        self.pad_inputs(bucket, q)
        batch = self.batch(bucket, q)
        model(batch, kv_pool, capture_layers=taps)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
            hidden, captured = model(batch, kv_pool, capture_layers=taps)
            greedy = argmax_rows(model.lm_head(hidden)) if q == 1 else None
        return graph, hidden, captured, greedy

    def _decode_steps(self, model: CausalLM, batch: ForwardBatch, kv_pool, k: int, taps, side) -> torch.Tensor:
        """k greedy decode steps of the batch in the static array, each fed the argmax of the one before: [k, bucket].
        With `side`, each step also runs side(its taps' outputs, positions, slots) (padding: slot -1) on the side
        stream: it waits for its step's forward, and the steps' end waits for every side run."""
        bucket = len(batch.rows)
        ones = torch.ones(bucket, dtype=torch.int64, device=self.static.device)
        out = torch.empty((k, bucket), dtype=torch.int64, device=self.static.device)
        main = torch.cuda.current_stream()
        # What the side stream's work reads, alive until the join: no later step's allocation reuses it meanwhile.
        held = []
        for step in range(k):
            if step:
                advance_inputs(self.static, bucket, 1, ones, out[step - 1], batch.req_to_token)
            hidden, captured = model(batch, kv_pool, capture_layers=taps)
            if side is not None:
                # this step's positions and slots (rows POSITIONS, SLOTS): the next step's advance rewrites them
                where = self.static[POSITIONS : SLOTS + 1, :bucket].clone()
                self.side_stream.wait_stream(main)
                with torch.cuda.stream(self.side_stream):
                    side(captured, where[0], where[1])
                held.append((captured, where))
            out[step] = argmax_rows(model.lm_head(hidden))
        if held:
            main.wait_stream(self.side_stream)
        return out
