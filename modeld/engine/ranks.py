"""Tensor-parallel ranks of one modeld. memd's layout sets how many (its tensor_parallel_size): modeld follows it, as
it follows memd's lookahead and prefill chunk.

Rank 0 is the engine process: it schedules, talks to memd, samples, and runs its share of every target forward. Each
other rank is a process of its own (`follower_main`) holding its share of the target (modeld.model.tensor_parallel)
and memd's KV pool of its rank, mapped from rank 0's layout; it holds no memd session, so memd's lease of rank 0's
session covers every rank's holdings. Before each target forward rank 0 sends the forward's inputs to every other rank
over a pipe, and each runs the same forward: the all-reduces inside the forwards pair up because every rank runs the
same forwards in the same order. The pipes carry the small host-side message; the collectives carry the activations.

With a DFLASH draft, every rank holds its share of the draft too (its heads and MLP width, the K/V of its heads in
its rank's draft pool), and rank 0's DFLASH worker announces the draft's forward and its K/V writes the same way;
each rank writes from the taps of its own last target forward (the same on every rank: the residual stream is
all-reduced), at the rows rank 0 names.

Messages, rank 0 -> rank r:  ("forward", fields, capture_layers)  ("propose", rows, starts, last tokens, max start)
                              ("context", rows, positions, slots)  ("commit", rows, positions, slots, lengths)
                              ("bind", layout bytes)  ("stop",)
                rank r -> 0:  ("ready",)  ("failed", message)  once, after start-up

A rank that dies ends the others: rank 0's next send or all-reduce fails and raises RankLost, which the engine loop
does not survive (the engine process exits, the front turns NOT_SERVING, memd frees the session); a follower whose
pipe or all-reduce fails (rank 0 is gone) exits."""

import datetime
import logging
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile

import numpy as np
import torch

from modeld.config import ModeldConfig
from modeld.engine.memd_link import StartupError
from modeld.model.causal_lm import ForwardBatch
from modeld.model.collectives import RankLost
from modeld.model.tensor_parallel import TensorParallel

log = logging.getLogger("modeld")

COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=120)  # a rank's wait at a rendezvous or an all-reduce
START_TIMEOUT_S = 300.0  # the other ranks' start-up: import torch, load and split the target, map the pools
STOP_TIMEOUT_S = 10.0
# ForwardBatch's index fields, in the order a "forward" message carries them (req_to_token is each rank's own map)
BATCH_FIELDS = ("input_ids", "positions", "out_slots", "rows", "q_starts", "q_lens", "kv_lens", "qo_indptr")


def backend_for(device: str) -> str:
    return "nccl" if device == "cuda" else "gloo"


class RankGroup:
    """Rank 0's side: starts ranks 1..size-1, joins them in torch.distributed's default group, and announces each
    target forward to them (`forward`, which CausalLM calls on rank 0: its `ranks`)."""

    def __init__(self, cfg: ModeldConfig, size: int, dtype: str, layout_bytes: bytes):
        self.size = size
        self.folder = tempfile.mkdtemp(prefix="modeld-ranks-")  # the rendezvous file: owner-only, no TCP port
        init = f"file://{os.path.join(self.folder, 'rendezvous')}"
        context = multiprocessing.get_context("spawn")
        self.conns, self.procs = [], []
        for rank in range(1, size):
            ours, theirs = context.Pipe()
            proc = context.Process(
                target=follower_main,
                args=(cfg, rank, size, dtype, init, layout_bytes, theirs),
                name=f"modeld-rank{rank}",
                daemon=True,
            )
            proc.start()
            theirs.close()
            self.conns.append(ours)
            self.procs.append(proc)
        try:
            torch.distributed.init_process_group(
                backend_for(cfg.device), init_method=init, rank=0, world_size=size, timeout=COLLECTIVE_TIMEOUT
            )
        except Exception:
            self.stop()
            raise

    @property
    def tensor_parallel(self) -> TensorParallel:
        return TensorParallel(0, self.size)

    def wait_ready(self) -> None:
        """Blocks until every other rank has its share of the target and its pools; StartupError with the first
        one's reason if one failed or did not answer in START_TIMEOUT_S (every rank then ended)."""
        for rank, conn in enumerate(self.conns, start=1):
            try:
                answer = conn.recv() if conn.poll(START_TIMEOUT_S) else ("failed", "no answer at start-up")
            except (EOFError, OSError):
                answer = ("failed", f"exited at start-up (exit code {self.procs[rank - 1].exitcode})")
            if answer[0] != "ready":
                self.stop()
                raise StartupError(f"tensor-parallel rank {rank} could not start: {answer[1]}")

    def forward(self, run, batch: ForwardBatch, kv_pool: torch.Tensor, capture_layers):
        """Announces the forward to every other rank, then runs rank 0's share (`run`, CausalLM's own forward)."""
        self._send(("forward", [_to_wire(getattr(batch, name)) for name in BATCH_FIELDS], tuple(capture_layers)))
        try:
            return run(batch, kv_pool, capture_layers)
        except RankLost as exc:
            self._raise_if_lost(exc)
            raise

    def announce(self, kind: str, *args) -> None:
        """A DFLASH worker's call every rank makes (modeld.spec.worker: "propose", "context", "commit"); tensors go as
        host arrays, other arguments as they are."""
        self._send((kind, *map(_to_wire, args)))

    def bind(self, layout_bytes: bytes) -> None:
        """memd's new pools (a re-attach): every other rank maps its own before the next forward."""
        self._send(("bind", layout_bytes))

    def _send(self, message) -> None:
        for rank, conn in enumerate(self.conns, start=1):
            try:
                conn.send(message)
            except OSError as exc:
                self._raise_if_lost(exc)
                raise RankLost(f"tensor-parallel rank {rank} is gone ({exc})") from None

    def _raise_if_lost(self, exc: Exception) -> None:
        for rank, proc in enumerate(self.procs, start=1):
            proc.join(timeout=0.5 if not proc.is_alive() else 0)
            if not proc.is_alive():
                raise RankLost(f"tensor-parallel rank {rank} exited (exit code {proc.exitcode}): {exc}") from None

    def stop(self) -> None:
        """Ends every other rank (asked, then terminated if it does not leave in STOP_TIMEOUT_S)."""
        for conn in self.conns:
            try:
                conn.send(("stop",))
            except OSError:
                pass
        for proc in self.procs:
            proc.join(timeout=STOP_TIMEOUT_S)
            if proc.is_alive():
                log.error("tensor-parallel rank %s did not stop: terminated", proc.name)
                proc.terminate()
                proc.join(timeout=STOP_TIMEOUT_S)
        for conn in self.conns:
            conn.close()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        shutil.rmtree(self.folder, ignore_errors=True)


def follower_main(cfg: ModeldConfig, rank: int, size: int, dtype: str, init: str, layout_bytes: bytes, conn) -> None:
    """Rank `rank`'s process: joins the group, loads its share of the target, maps its pools, then runs the forwards
    rank 0 announces until "stop" or the end of the pipe. Stop signals are rank 0's to handle, as the engine
    process's are its front's."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    logging.basicConfig(level=cfg.log_level, format=f"%(asctime)s modeld rank{rank} %(levelname)s %(message)s")
    code = 0
    try:
        torch.distributed.init_process_group(
            backend_for(cfg.device), init_method=init, rank=rank, world_size=size, timeout=COLLECTIVE_TIMEOUT
        )
        try:
            share = _Share(cfg, rank, size, dtype, layout_bytes)
        except Exception as exc:
            log.exception("rank %d could not start", rank)
            conn.send(("failed", f"{type(exc).__name__}: {exc}"))
            raise
        conn.send(("ready",))
        _serve(conn, share)
    except (EOFError, OSError):
        log.info("rank 0 is gone: rank %d stops", rank)
    except BaseException:
        log.exception("rank %d failed", rank)
        code = 1
    finally:
        logging.shutdown()
        sys.stderr.flush()
        os._exit(code)  # as the engine process leaves: no interpreter finalisation racing the group's threads


def _to_wire(value):
    return value.cpu().numpy() if isinstance(value, torch.Tensor) else value


def _from_wire(value, device):
    return torch.from_numpy(np.asarray(value)).to(device) if isinstance(value, np.ndarray) else value


class _Share:
    """A rank's share of the model: the target's, the draft's (a DFLASH worker over the rank's draft pool), and
    memd's pools of the rank."""

    def __init__(self, cfg: ModeldConfig, rank: int, size: int, dtype: str, layout_bytes: bytes):
        from modeld.model.loader import load_target
        from modeld.spec.draft import load_served_draft
        from modeld.spec.worker import DflashWorker

        self.rank = rank
        tp = TensorParallel(rank, size)
        self.model, _, hf_config = load_target(cfg.target_model, dtype, cfg.device, cfg.load_format, tp)
        self.model.use_skinny_linear(cfg.tuning.skinny_linear, fuse_norms=cfg.tuning.norm_fusion)
        self.worker = None
        self.bind(layout_bytes)
        if cfg.speculative_algorithm == "dflash":
            self.worker = DflashWorker(load_served_draft(cfg, hf_config, dtype, tp), self.model, self.pools)
            self.worker.draft.use_skinny_linear(cfg.tuning.skinny_linear, fuse_norms=cfg.tuning.norm_fusion)
        self.captured: list[torch.Tensor] = []  # the taps of the last target forward

    def bind(self, layout_bytes: bytes) -> None:
        from memd.attach import map_layout
        from protos import memd_pb2

        self.pools = map_layout(memd_pb2.Layout.FromString(layout_bytes), self.rank)
        if self.worker is not None:
            self.worker.bind(self.pools)

    def forward(self, fields, capture_layers) -> None:
        kv_pool = self.pools["target_kv"]
        tensors = {name: _from_wire(value, kv_pool.device) for name, value in zip(BATCH_FIELDS, fields)}
        batch = ForwardBatch(req_to_token=self.pools["req_to_token"], **tensors)
        _, self.captured = self.model(batch, kv_pool, capture_layers=capture_layers)

    def spec_call(self, kind: str, args) -> None:
        args = [_from_wire(a, self.pools["target_kv"].device) for a in args]
        if kind == "propose":
            self.worker.draft_hidden(*args)
        elif kind == "context":
            self.worker.context_rows(self.captured, *args)
        else:
            self.worker.committed_rows(self.captured, *args)


@torch.inference_mode()
def _serve(conn, share: _Share) -> None:
    while True:
        message = conn.recv()
        kind = message[0]
        if kind == "stop":
            return
        if kind == "bind":
            share.bind(message[1])
        elif kind == "forward":
            share.forward(*message[1:])
        else:
            share.spec_call(kind, message[1:])
