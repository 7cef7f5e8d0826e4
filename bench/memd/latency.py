"""memd's round trip as modeld sees it, side by side in one run: memd's CPU (shared memory) and CUDA backends, with
the GPU idle and with the GPU kept busy by another process's small kernels (as modeld's decode steps keep it).

    python -m bench.memd.latency [--target bench/configs/llama3-8b] [--calls 200]

Each call sequence is a request's admission and release: MatchPrefix, an Alloc of 16 tokens, a Free, after a
gRPC health check on the same channel (what any call costs: the rest is memd's own work); as unary RPCs, then the
same over the session's Calls stream (what modeld sends since the stream came). Prints the median and
90th percentile of each call per configuration, in milliseconds. Then a burst of 16 arrivals (time_bursts): registered
by 16 MatchPrefix calls in flight together or by one MatchPrefixBatch, and admitted (prompts granted) by a
MatchPrefixBatch and an Alloc or by one MatchPrefixBatch whose items ask for their prompts. Without a GPU: the CPU
backend only.
"""

import argparse
import contextlib
import multiprocessing
import statistics
import time

import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.common.memd_process import memd_process
from memd.attach import MemdSession
from protos import memd_pb2

CALLS = (
    "Health check (gRPC alone)",
    "MatchPrefix",
    "Alloc",
    "Free",
    "MatchPrefix, stream",
    "Alloc, stream",
    "Free, stream",
)


def keep_gpu_busy(ready, stop) -> None:
    """Another process launching small kernels back to back, as a decode loop does."""
    import torch

    x = torch.randn(64, 576, device="cuda")
    w = torch.randn(576, 576, device="cuda")
    ready.set()
    while not stop.is_set():
        for _ in range(300):
            x = torch.relu(x @ w) * 0.01
        torch.cuda.synchronize()


@contextlib.contextmanager
def gpu_load(busy: bool):
    """With `busy`, another process keeps the GPU busy (keep_gpu_busy) until the block ends; else nothing."""
    if not busy:
        yield
        return
    ctx = multiprocessing.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    load = ctx.Process(target=keep_gpu_busy, args=(ready, stop))
    load.start()
    ready.wait(120)
    try:
        yield
    finally:
        stop.set()
        load.join(60)


def admit_and_release(session: MemdSession, rid: str, send) -> list[float]:
    """A request's MatchPrefix, its Alloc up to 16 tokens and its Free, each sent as send(kind, request) answers it;
    the clock after each."""
    sid, ids, stamps = session.session_id, list(range(100, 116)), []
    matched = send("match_prefix", memd_pb2.MatchPrefixRequest(session_id=sid, rid=rid, token_ids=ids))
    stamps.append(time.perf_counter())
    send(
        "alloc",
        memd_pb2.AllocRequest(
            session_id=sid,
            extends=[
                memd_pb2.ExtendOp(rid=rid, prefix_len=matched.cached_len, num_tokens=len(ids) - matched.cached_len)
            ],
        ),
    )
    stamps.append(time.perf_counter())
    send("free", memd_pb2.FreeRequest(session_id=sid, finish=[rid]))
    stamps.append(time.perf_counter())
    return stamps


def time_calls(address: str, calls: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in CALLS}
    with MemdSession(address, "bench-memd-latency", writes_draft_kv=False) as session:
        health = health_pb2_grpc.HealthStub(session.channel)
        unary = {"match_prefix": session.stub.MatchPrefix, "alloc": session.stub.Alloc, "free": session.stub.Free}
        for i in range(calls):
            t = [time.perf_counter()]
            health.Check(health_pb2.HealthCheckRequest())
            t.append(time.perf_counter())
            t += admit_and_release(session, f"r{i}", lambda kind, request: unary[kind](request, timeout=10))
            t += admit_and_release(
                session, f"r{i}", lambda kind, request: session.calls.submit(kind, request, 10).result()
            )
            for name, begin, end in zip(times, t, t[1:]):
                times[name].append((end - begin) * 1e3)
    return times


def time_bursts(address: str, calls: int, size: int = 16, prompt: int = 40) -> dict[str, list[float]]:
    """A burst of `size` arrivals of `prompt` tokens, four ways, alternating, each burst freed before the next:
    registered by `size` MatchPrefix calls in flight together (modeld until fbf7067) or by one MatchPrefixBatch
    (modeld since); admitted (registered and their prompts granted) by that batch and then an Alloc (modeld until
    the batch carried extend_to) or by one MatchPrefixBatch whose items ask for their prompts (modeld since)."""
    names = (
        f"{size} MatchPrefix in flight",
        f"one MatchPrefixBatch of {size}",
        f"admitted: MatchPrefixBatch + Alloc of {size}",
        f"admitted: one MatchPrefixBatch granting {size}",
    )
    times: dict[str, list[float]] = {name: [] for name in names}
    with MemdSession(address, "bench-memd-bursts", writes_draft_kv=False) as session:

        def in_flight(items):
            futures = [
                session.stub.MatchPrefix.future(
                    memd_pb2.MatchPrefixRequest(session_id=session.session_id, rid=rid, token_ids=ids), timeout=10
                )
                for rid, ids in items
            ]
            for future in futures:
                future.result()

        def batch_then_alloc(items):
            matched = session.match_prefix_batch(items)
            session.alloc(extends=[(m.rid, m.cached_len, prompt - m.cached_len) for m in matched])

        def granting_batch(items):
            matched = session.match_prefix_batch([(rid, ids, prompt) for rid, ids in items])
            assert all(m.HasField("extension") for m in matched)

        ways = (in_flight, session.match_prefix_batch, batch_then_alloc, granting_batch)
        for i in range(calls):
            for k, (name, way) in enumerate(zip(names, ways)):
                items = [(f"b{i}-{k}-{j}", list(range(100 + j, 100 + j + prompt))) for j in range(size)]
                t0 = time.perf_counter()
                way(items)
                times[name].append((time.perf_counter() - t0) * 1e3)
                session.free(finishes=[rid for rid, _ in items])
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="bench/configs/llama3-8b")
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    bursts = []
    print("| memd backend | GPU | " + " | ".join(f"{name} p50 / p90 ms" for name in CALLS) + " |")
    print("|---|---|" + "---|" * len(CALLS))
    for device in ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",):
        with memd_process(
            "--device",
            device,
            "--target-model",
            args.target,
            "--max-total-tokens",
            "65536",
            "--max-running-requests",
            "64",
            "--kv-cache-dtype",
            "bfloat16",
        ) as address:
            for busy in (False, True) if device == "cuda" else (False,):
                with gpu_load(busy):  # both timings under the same load (the bursts' row carries this row's GPU label)
                    times = time_calls(address, args.calls)
                    burst_times = time_bursts(address, max(20, args.calls // 10))
                gpu = "none" if device == "cpu" and not torch.cuda.is_available() else "busy" if busy else "idle"
                print(f"| {device} | {gpu} | " + " | ".join(map(quantiles, times.values())) + " |", flush=True)
                bursts.append((device, gpu, burst_times))
    names = list(bursts[0][2])
    print("\n| memd backend | GPU | " + " | ".join(f"{name} p50 / p90 ms" for name in names) + " |")
    print("|---|---|" + "---|" * len(names))
    for device, gpu, times in bursts:
        print(f"| {device} | {gpu} | " + " | ".join(map(quantiles, times.values())) + " |")


def quantiles(times: list[float]) -> str:
    return f"{statistics.median(times):.3f} / {statistics.quantiles(times, n=10)[-1]:.3f}"


if __name__ == "__main__":
    main()
