"""memd's table publication on the GPU (memd.buffers.CudaBuffers.sync), in process, with the GPU idle and with another
process keeping it busy (as modeld's steps do): the call's host time. A call here writes what an Alloc of 16 tokens
writes (16 req_to_token entries and 16 target_to_draft entries).

    python -m bench.table_sync [--calls 300]

Needs a GPU (CuPy). Prints milliseconds, median and 90th percentile.
"""

import argparse
import time

import numpy as np

from bench.memd_latency import gpu_load, quantiles
from memd.buffers import CudaBuffers


def one_call(buffers: CudaBuffers, at: int) -> None:
    """What an Alloc of 16 tokens writes: a row's 16 positions and their target->draft entries."""
    idx = np.arange(at, at + 16, dtype=np.int64)
    for name in ("req_to_token", "target_to_draft"):
        buffers.tables[name].reshape(-1)[idx] = idx.astype(np.int32)
        buffers.write(name, idx, idx.astype(np.int32))


def time_sync(buffers: CudaBuffers, calls: int) -> list[float]:
    times = []
    for i in range(calls):
        one_call(buffers, (i * 16) % 60000)
        start = time.perf_counter()
        buffers.sync()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    buffers = CudaBuffers(0)
    buffers.create_table("req_to_token", [64, 4096])
    buffers.create_table("target_to_draft", [65536])
    time_sync(buffers, 20)  # warm: the scatter kernel loaded, CuPy's pools filled
    print("| GPU | sync (ms) median / p90 |\n|---|---|")
    for busy in (False, True):
        with gpu_load(busy):
            times = time_sync(buffers, args.calls)
        print(f"| {'busy' if busy else 'idle'} | {quantiles(times)} |")
    buffers.close()


if __name__ == "__main__":
    main()
