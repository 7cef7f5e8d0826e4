"""The skinny kernel (modeld/kernels/skinny_linear.py) against cuBLAS, side by side in one run, at the weight shapes of
the 8B geometry and of the default model: for one row (a batch-1 decode step) and 16 (one request's DFLASH block),
every tile in the sweep, and the bandwidth each reaches.

Each timing is a CUDA graph of many launches over enough copies of the weight (at least 512 MB) that none is read
from L2, as in a model whose layers each have their own weights; device time per launch from CUDA events.

    python -m bench.kernels.skinny_linear [--rows 1,16] [--quick] [--only qkv,down]

Prints a markdown table per shape (cuBLAS, the five fastest tiles, and last the tile TILES holds for the shape), then
the fastest tile per shape at one row, in the form of the `TILES` entries the kernel reads.
"""

import argparse
import itertools
import json

import torch

from modeld.kernels.skinny_linear import TILES, skinny_launch

# (name, N, K): the 8B geometry (Llama-3-8B) and the default model (SmolLM2-135M)
SHAPES = [
    ("8B qkv", 6144, 4096),
    ("8B o_proj", 4096, 4096),
    ("8B down", 4096, 14336),
    ("8B gate_up", 28672, 4096),
    ("135M qkv", 960, 576),
    ("135M o_proj", 576, 576),
    ("135M down", 576, 1536),
    ("135M gate_up", 3072, 576),
]
SWEEP = list(itertools.product((16, 32, 64), (64, 128, 256, 512), (4, 8), (3, 4, 5)))  # tiles that do not fit fail
QUICK = [(n, k, 4, s) for n, k, s in itertools.product((16, 32, 64), (128, 256), (3, 4))]
ROTATION_BYTES = 512 << 20
LAUNCHES = 200


def device_us(fn, copies: int) -> float:
    """Microseconds of device time per launch of fn(i), i cycling over the weight copies, from one graph replay."""
    for i in range(copies):  # compile and warm up outside the capture
        fn(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for j in range(LAUNCHES):
            fn(j % copies)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(3):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return 1000 * start.elapsed_time(end) / (3 * LAUNCHES)


def one_shape(name, n, k, rows, tiles) -> tuple[list[str], tuple]:
    weight_bytes = n * k * 2
    copies = max(2, -(-ROTATION_BYTES // weight_bytes))
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5 for _ in range(copies)]
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    reference = torch.nn.functional.linear(x, weights[0]).float()
    base = device_us(lambda i: torch.nn.functional.linear(x, weights[i]), copies)
    lines = [f"| {name} | {rows} | cuBLAS | {base:.2f} | {weight_bytes / base / 1e6:.2f} | 1.00 | - |"]
    timed = []
    current = TILES.get((n, k))
    for tile in tiles + ([current] if current and current not in tiles else []):
        try:
            out = skinny_launch(x, weights[0], None, tile).float()
            err = ((out - reference).abs().max() / reference.abs().max()).item()
            us = device_us(lambda i: skinny_launch(x, weights[i], None, tile), copies)  # noqa: B023
        except Exception as e:  # a tile that does not compile (shared memory) is reported, not fatal
            lines.append(f"| {name} | {rows} | {tile} | failed: {type(e).__name__} | - | - | - |")
            continue
        timed.append((us, tile, err))
    timed.sort()
    for us, tile, err in timed[:5] + [t for t in timed if t[1] == current][:1]:
        lines.append(
            f"| {name} | {rows} | skinny {tile} | {us:.2f} | {weight_bytes / us / 1e6:.2f} | "
            f"{base / us:.2f} | {err:.1e} |"
        )
    weights.clear()  # the copies go now: the closures above are done with them
    torch.cuda.empty_cache()
    return lines, (timed[0][1] if timed else None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="1,16")
    parser.add_argument("--only", help="comma-separated parts of shape names to time (default: every shape)")
    parser.add_argument(
        "--quick", action="store_true", help="a small sweep (12 tiles, and the shape's tile in TILES) instead of 72"
    )
    args = parser.parse_args()
    print(
        f"GPU: {torch.cuda.get_device_name()}; bf16; device time per launch over rotating weight copies "
        f"(at least {ROTATION_BYTES >> 20} MB: none from L2); TB/s = weight bytes / time\n"
    )
    print("| shape | rows | kernel (block_n, block_k, warps, stages) | µs | TB/s | x cuBLAS | max rel err vs cuBLAS |")
    print("|---|---|---|---|---|---|---|")
    best = {}
    for rows in (int(r) for r in args.rows.split(",")):
        for name, n, k in (s for s in SHAPES if not args.only or any(o in s[0] for o in args.only.split(","))):
            lines, tile = one_shape(name, n, k, rows, QUICK if args.quick else SWEEP)
            print("\n".join(lines), flush=True)
            if rows == 1 and tile is not None:
                best[f"{n},{k}"] = tile
    print("\nbest tile at one row, per (N, K):", json.dumps(best), "(TILES: the last row of each shape)")


if __name__ == "__main__":
    main()
