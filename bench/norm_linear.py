"""The residual add + RMSNorm (+ SiLU-mul) folded into the skinny projection (modeld/kernels/norm_linear.py) against
the same ops as separate kernels (the norm kernel, the skinny projection, the SiLU-mul kernel), side by side in one
run, at the q|k|v and gate|up shapes of the 8B geometry and of the default model, for one row and for 16.

Timing as in bench.skinny_linear: a CUDA graph of many launches over weight copies that do not fit in L2, device
time per launch from CUDA events. The fused kernel is timed with the tile modeld uses (the projection's TILES entry,
half the columns for gate|up); with --sweep also with 18 others, and the fastest is printed after it.

    python -m bench.norm_linear [--rows 1,16] [--sweep]
"""

import argparse
import itertools

import torch

from bench.skinny_linear import ROTATION_BYTES, device_us
from modeld.kernels.fused import rms_norm, silu_mul
from modeld.kernels import norm_linear as fused_norm
from modeld.kernels.norm_linear import norm_linear_launch
from modeld.kernels.skinny_linear import TILES, skinny_launch

# (name, N, K, with SiLU-mul): the projections that follow a norm
SHAPES = [("8B qkv", 6144, 4096, False), ("8B gate_up", 28672, 4096, True),
          ("135M qkv", 960, 576, False), ("135M gate_up", 3072, 576, True)]
OTHER_TILES = list(itertools.product((16, 32, 64), (128, 256, 512), (4,), (3, 4)))
EPS = 1e-5


def one_shape(name: str, n: int, k: int, silu: bool, rows: int, sweep: bool) -> list[str]:
    copies = max(2, -(-ROTATION_BYTES // (n * k * 2)))
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5 for _ in range(copies)]
    x, residual = (torch.randn(rows, k, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    norm_weight = torch.ones(k, device="cuda", dtype=torch.bfloat16)
    tile = TILES[(n, k)]

    def unfused(i):
        h, _ = rms_norm(x, norm_weight, EPS, residual)
        y = skinny_launch(h, weights[i], None, tile)
        return silu_mul(y) if silu else y

    reference = unfused(0).float()
    base = device_us(unfused, copies)
    lines = [f"| {name} | {rows} | norm + skinny{' + silu_mul' if silu else ''} {tile} | {base:.2f} | 1.00 | - |"]
    timed = []
    fused_norm.norm_linear(x, residual, norm_weight, EPS, weights[0], None, silu)  # settles the tile modeld runs
    used = fused_norm.tile_in_use(weights[0], silu)
    if used is None:
        return lines + [f"| {name} | {rows} | fused: no tile fits this card's shared memory (modeld runs the ops "
                        f"apart) | - | - | - |"]
    for fused_tile in [used] + ([t for t in OTHER_TILES if t != used] if sweep else []):
        try:
            out = norm_linear_launch(x, residual, norm_weight, EPS, weights[0], None, fused_tile, silu)[0].float()
            err = ((out - reference).abs().max() / reference.abs().max()).item()
            us = device_us(lambda i: norm_linear_launch(x, residual, norm_weight, EPS, weights[i], None,  # noqa: B023
                                                        fused_tile, silu), copies)
        except Exception as e:  # a tile that does not compile (shared memory) is reported, not fatal
            lines.append(f"| {name} | {rows} | fused {fused_tile} | failed: {type(e).__name__} | - | - |")
            continue
        timed.append((us, fused_tile, err))
    if not timed:
        return lines
    best = min(timed)
    for us, fused_tile, err in [t for t in timed if t[1] == used] + ([best] if best[1] != used else []):
        label = "fused, modeld's tile" if fused_tile == used else "fused, fastest tile"
        lines.append(f"| {name} | {rows} | {label} {fused_tile} | {us:.2f} | {base / us:.2f} | {err:.1e} |")
    del weights
    torch.cuda.empty_cache()
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="1,16")
    parser.add_argument("--sweep", action="store_true", help="time 18 other tiles of the fused kernel too")
    args = parser.parse_args()
    print(f"GPU: {torch.cuda.get_device_name()}; bf16; device time per launch (µs) over rotating weight copies\n")
    print("| shape | rows | kernels (block_n, block_k, warps, stages) | µs | x unfused | max rel err vs unfused |")
    print("|---|---|---|---|---|---|")
    for rows in (int(r) for r in args.rows.split(",")):
        for name, n, k, silu in SHAPES:
            print("\n".join(one_shape(name, n, k, silu, rows, args.sweep)), flush=True)


if __name__ == "__main__":
    main()
