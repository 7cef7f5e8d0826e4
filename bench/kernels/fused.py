"""modeld's fused kernels against the launches each replaces, side by side in one run, at the shapes of the 8B
geometry and of the default model (and of their DFLASH drafts), for one row and for 16 (and for more: modeld runs the
fused kernels for at most 16 rows, and against its path above that, norm + cuBLAS, they say whether more should):
- the residual add + RMSNorm (+ SiLU-mul) folded into the skinny projection (modeld/kernels/norm_linear.py) against
  the norm kernel, the skinny projection and the SiLU-mul kernel, at the q|k|v and gate|up shapes;
- the attention input in one launch (modeld/kernels/norm_qkv_rotary.py: norm, q|k|v, rotary, K/V write) against the
  norm kernel, the skinny q|k|v and rotary_store;
- the draft's q/k norms and rotary in one launch (modeld/kernels/qk_norm_rotary.py) against two norm launches and
  rotary, over a block of 16 rows a request;
- the two-launch argmax (modeld/kernels/argmax.py) against torch.argmax over the vocabularies;
- DFLASH's acceptance rule in one launch (modeld/kernels/accept.py) against its torch operations, the cycle graph's
  padding mask included, per verified block of 16.

Timing as in bench.kernels.skinny_linear: a CUDA graph of many launches over weight copies that do not fit in L2, device
time per launch from CUDA events. The fused kernel is timed with the tile modeld uses (its FUSED_TILES or
ATTENTION_TILES entry); where modeld has none (it runs the ops apart there), and with --sweep, also with 18 other
tiles (for the attention input those of at most half a head's columns), and the fastest is printed after it.

    python -m bench.kernels.fused [--rows 1,16,64,256] [--sweep] [--only 8B|135M|DFLASH]
"""

import argparse
import itertools

import torch

from bench.kernels.skinny_linear import ROTATION_BYTES, device_us
from modeld.kernels import norm_linear as fused_norm
from modeld.kernels.accept import accept_lengths_torch, accept_lengths_triton
from modeld.kernels.argmax import argmax_rows
from modeld.kernels.fused import rms_norm, rotary, silu_mul
from modeld.kernels.norm_linear import FUSED_TILES, norm_linear_launch
from modeld.kernels.norm_qkv_rotary import ATTENTION_TILES, norm_qkv_rotary_launch
from modeld.kernels.qk_norm_rotary import qk_norm_rotary
from modeld.kernels.rotary_store import rotary_store
from modeld.kernels.skinny_linear import MAX_ROWS, TILES, skinny_launch
from modeld.kernels.tile_fitting import tile_in_use

# (name, N, K, with SiLU-mul): the projections that follow a norm
SHAPES = [
    ("8B qkv", 6144, 4096, False),
    ("8B gate_up", 28672, 4096, True),
    ("135M qkv", 960, 576, False),
    ("135M gate_up", 3072, 576, True),
]
ATTENTION_INPUTS = [("8B qkv", 4096, 32, 8, 128), ("135M qkv", 576, 9, 3, 64)]  # (name, K, q heads, kv heads, D)
DRAFT_HEADS = [("8B draft", 32, 8, 128), ("135M draft", 9, 3, 64)]  # (name, q heads, kv heads, D)
VOCABS = [("8B", 128256), ("135M", 49152)]
ACCEPT_BLOCKS = [("DFLASH", 16)]  # (name, block size): geometry-free
OTHER_TILES = list(itertools.product((16, 32, 64), (128, 256, 512), (4,), (3, 4)))
EPS = 1e-5


def projection(rows: int, tile):
    """What modeld projects `rows` rows with, unfused: the skinny kernel (at most MAX_ROWS), else cuBLAS; its name."""
    if rows <= MAX_ROWS:
        return (lambda h, w: skinny_launch(h, w, None, tile)), f"skinny {tile}"
    return (lambda h, w: torch.nn.functional.linear(h, w)), "cuBLAS"


def norm_projection_inputs(n: int, k: int, rows: int):
    """(copies, weights, x, residual, norm weight): enough copies of an [n, k] weight that none is read from L2."""
    copies = max(2, -(-ROTATION_BYTES // (n * k * 2)))
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5 for _ in range(copies)]
    x, residual = (torch.randn(rows, k, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    return copies, weights, x, residual, torch.ones(k, device="cuda", dtype=torch.bfloat16)


def fused_lines(name: str, rows: int, base: float, used, candidates, run, copies: int, reference) -> list[str]:
    """Timings of a fused kernel, run(i, tile) on weight copy i: modeld's tile `used` (None: modeld runs these ops
    apart) and the other candidate tiles, printed as modeld's tile, the fastest where it is another, and failures
    (a tile that does not compile, shared memory, is reported, not fatal). `base`: the unfused launches' µs."""
    timed, lines = [], []
    for tile in ([used] if used else []) + [t for t in candidates if t != used]:
        try:
            out = run(0, tile).float()
            err = ((out - reference).abs().max() / reference.abs().max()).item()
            timed.append((device_us(lambda i: run(i, tile), copies), tile, err))  # noqa: B023
        except Exception as e:
            lines.append(f"| {name} | {rows} | fused {tile} | failed: {type(e).__name__} | - | - |")
    if used is None:
        lines.append(f"| {name} | {rows} | fused: not in modeld's table (modeld runs the ops apart) | - | - | - |")
    best = min(timed, default=None)
    for us, tile, err in timed:
        if tile == used or tile == best[1]:
            label = "fused, modeld's tile" if tile == used else "fused, fastest tile"
            lines.append(f"| {name} | {rows} | {label} {tile} | {us:.2f} | {base / us:.2f} | {err:.1e} |")
    return lines


def one_shape(name: str, n: int, k: int, silu: bool, rows: int, sweep: bool) -> list[str]:
    copies, weights, x, residual, norm_weight = norm_projection_inputs(n, k, rows)
    project, project_name = projection(rows, TILES[(n, k)])

    def unfused(i):
        h, _ = rms_norm(x, norm_weight, EPS, residual)
        y = project(h, weights[i])
        return silu_mul(y) if silu else y

    def fused(i, tile):
        return norm_linear_launch(x, residual, norm_weight, EPS, weights[i], None, tile, silu)[0]

    base = device_us(unfused, copies)
    lines = [f"| {name} | {rows} | norm + {project_name}{' + silu_mul' if silu else ''} | {base:.2f} | 1.00 | - |"]
    used = None
    if (n, k, silu) in FUSED_TILES:  # the tile modeld runs, after any fewer stages this card needs
        if fused_norm.norm_linear(x, residual, norm_weight, EPS, weights[0], None, silu) is None:
            return lines + [
                f"| {name} | {rows} | fused: no tile fits this card's shared memory (modeld runs the ops "
                f"apart) | - | - | - |"
            ]
        used = tile_in_use(fused_norm.fitting_key(weights[0], silu, True))
    lines += fused_lines(
        name, rows, base, used, OTHER_TILES if sweep or used is None else [], fused, copies, unfused(0).float()
    )
    weights.clear()  # the copies go now: the closures above are done with them
    torch.cuda.empty_cache()
    return lines


def attention_input(name: str, k: int, q_heads: int, kv_heads: int, head_dim: int, rows: int, sweep: bool) -> list[str]:
    n = (q_heads + 2 * kv_heads) * head_dim
    copies, weights, x, residual, norm_weight = norm_projection_inputs(n, k, rows)
    cos, sin = (torch.rand(rows, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    caches = [torch.zeros(4096, kv_heads, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    slots = torch.arange(rows, device="cuda") + 7
    split = (q_heads * head_dim, kv_heads * head_dim, kv_heads * head_dim)
    project, project_name = projection(rows, TILES[(n, k)])

    def apart(i):
        h, _ = rms_norm(x, norm_weight, EPS, residual)
        q, kk, v = project(h, weights[i]).split(split, dim=-1)
        return rotary_store(
            q.unflatten(-1, (q_heads, head_dim)),
            kk.unflatten(-1, (kv_heads, head_dim)),
            v.unflatten(-1, (kv_heads, head_dim)),
            cos,
            sin,
            *caches,
            slots,
        )

    def fused(i, tile):
        return norm_qkv_rotary_launch(
            x, residual, norm_weight, EPS, weights[i], None, cos, sin, *caches, slots, q_heads, kv_heads, tile
        )[0]

    base = device_us(apart, copies)
    lines = [f"| {name} attention input | {rows} | norm + {project_name} + rotary_store | {base:.2f} | 1.00 | - |"]
    used = ATTENTION_TILES.get((n, k))
    candidates = [t for t in OTHER_TILES if t[0] <= head_dim // 2] if sweep or used is None else []
    lines += fused_lines(f"{name} attention input", rows, base, used, candidates, fused, copies, apart(0).float())
    weights.clear()  # the copies go now: the closures above are done with them
    torch.cuda.empty_cache()
    return lines


def draft_qk(name: str, q_heads: int, kv_heads: int, head_dim: int, requests: int) -> str:
    """The draft's q/k norms and rotary over `requests` blocks of 16 rows."""
    rows = 16 * requests
    qkv = torch.randn(rows, (q_heads + 2 * kv_heads) * head_dim, device="cuda", dtype=torch.bfloat16)
    q, k, _ = qkv.split((q_heads * head_dim, kv_heads * head_dim, kv_heads * head_dim), dim=-1)
    q, k = q.unflatten(-1, (q_heads, head_dim)), k.unflatten(-1, (kv_heads, head_dim))
    qw, kw = (torch.ones(head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    cos, sin = (torch.rand(rows, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))

    def apart(i):
        qn = rms_norm(q.reshape(-1, head_dim), qw, EPS)[0].view(rows, q_heads, head_dim)
        kn = rms_norm(k.reshape(-1, head_dim), kw, EPS)[0].view(rows, kv_heads, head_dim)
        return rotary(qn, kn, cos, sin)

    base, us = device_us(apart, 1), device_us(lambda i: qk_norm_rotary(q, k, qw, kw, EPS, cos, sin), 1)
    return (
        f"| {name} q/k norms + rotary | {rows} | q_norm, k_norm, rotary: {base:.2f} µs; in one launch | "
        f"{us:.2f} | {base / us:.2f} | - |"
    )


def argmax_row(name: str, vocab: int, rows: int) -> str:
    logits = torch.randn(rows, vocab, device="cuda", dtype=torch.bfloat16)
    assert torch.equal(argmax_rows(logits), logits.argmax(dim=-1))
    base = device_us(lambda i: logits.argmax(dim=-1), 1)
    us = device_us(lambda i: argmax_rows(logits), 1)
    return (
        f"| {name} argmax of {vocab} | {rows} | torch.argmax: {base:.2f} µs; two launches | {us:.2f} | "
        f"{base / us:.2f} | - |"
    )


def accept_row(name: str, block: int, requests: int) -> str:
    """The acceptance rule of `requests` verified blocks, with the cycle graph's padding mask (every third padding)."""
    gen = torch.Generator(device="cuda").manual_seed(requests)
    target = torch.randint(0, 4, (requests, block), device="cuda", generator=gen)
    drafts = torch.randint(0, 4, (requests, block - 1), device="cuda", generator=gen)
    live = torch.where(torch.arange(requests, device="cuda") % 3 == 2, -1, 1)
    assert torch.equal(accept_lengths_triton(drafts, target, live), accept_lengths_torch(drafts, target, live))
    base = device_us(lambda i: accept_lengths_torch(drafts, target, live), 1)
    us = device_us(lambda i: accept_lengths_triton(drafts, target, live), 1)
    return (
        f"| {name} acceptance, block {block} | {requests} | torch (eq, cast, cumprod, sum, add, mask): {base:.2f} µs; "
        f"one launch | {us:.2f} | {base / us:.2f} | - |"
    )


def of_geometry(shapes: list[tuple], prefix: str) -> list[tuple]:
    """The shapes whose name starts with `prefix` ("8B", "135M"; "": all)."""
    return [shape for shape in shapes if shape[0].startswith(prefix)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="1,16")
    parser.add_argument("--sweep", action="store_true", help="time 18 other tiles of the fused kernel too")
    parser.add_argument(
        "--only",
        default="",
        help="the shapes of one geometry: 8B or 135M, or the acceptance rule alone: DFLASH (default: all)",
    )
    args = parser.parse_args()
    print(f"GPU: {torch.cuda.get_device_name()}; bf16; device time per launch (µs) over rotating weight copies\n")
    print("| shape | rows | kernels (block_n, block_k, warps, stages) | µs | x unfused | max rel err vs unfused |")
    print("|---|---|---|---|---|---|")
    for rows in (int(r) for r in args.rows.split(",")):
        for name, n, k, silu in of_geometry(SHAPES, args.only):
            print("\n".join(one_shape(name, n, k, silu, rows, args.sweep)), flush=True)
        for name, k, q_heads, kv_heads, head_dim in of_geometry(ATTENTION_INPUTS, args.only):
            print("\n".join(attention_input(name, k, q_heads, kv_heads, head_dim, rows, args.sweep)), flush=True)
        for name, q_heads, kv_heads, head_dim in of_geometry(DRAFT_HEADS, args.only):
            print(draft_qk(name, q_heads, kv_heads, head_dim, rows), flush=True)
        for name, vocab in of_geometry(VOCABS, args.only):
            print(argmax_row(name, vocab, rows), flush=True)
        for name, block in of_geometry(ACCEPT_BLOCKS, args.only):
            print(accept_row(name, block, rows), flush=True)


if __name__ == "__main__":
    main()
