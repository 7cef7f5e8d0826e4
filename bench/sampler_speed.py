"""The sampler's cost per step, side by side in one run: one multinomial draw per row (the sampler before
modeld.sampling drew its rows together) against modeld.sampling.sample, for the row counts a step samples (plain
decoding: one row per request; DFLASH: a block of rows per request), temperature 0.8 and top-p 0.95, one seeded
generator per request, on the default model's vocabulary.

    python -m bench.sampler_speed [--vocab 49152] [--repeats 20]
"""

import argparse
import time

import torch

from modeld.sampling import sample
from modeld.sampling_params import SamplingParams

SHAPES = [(1, 1), (16, 1), (64, 1), (1, 16), (16, 16), (64, 16)]  # (requests, rows per request)


def per_row_draws(logits: torch.Tensor, params: list[SamplingParams], generators) -> torch.Tensor:
    """The sampler before: for every row, temperature, top-p over its sorted probabilities, one multinomial draw."""
    out = logits.argmax(dim=-1)
    for i, p in enumerate(params):
        probs = torch.softmax(logits[i] / p.temperature, dim=-1)
        sorted_probs, order = probs.sort(descending=True)
        sorted_probs[sorted_probs.cumsum(-1) - sorted_probs >= p.top_p] = 0
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        out[i] = torch.multinomial(probs / probs.sum(), 1, generator=generators[i])[0]
    return out


def timed(fn, repeats: int) -> float:
    """Milliseconds per call (host and device: synchronised after the calls)."""
    fn()
    torch.cuda.synchronize()
    begin = time.perf_counter()
    for _ in range(repeats):
        fn()
    torch.cuda.synchronize()
    return 1000 * (time.perf_counter() - begin) / repeats


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    print(f"GPU: {torch.cuda.get_device_name()}, vocabulary {args.vocab}, temperature 0.8, top-p 0.95\n")
    print("| requests | rows per request | rows | a draw per row, ms | batched draw, ms | x |")
    print("|---|---|---|---|---|---|")
    for requests, rows in SHAPES:
        logits = torch.randn(requests * rows, args.vocab, device="cuda") * 4
        params = [SamplingParams(temperature=0.8, top_p=0.95, seed=r) for r in range(requests) for _ in range(rows)]
        gens = [torch.Generator(device="cuda").manual_seed(r) for r in range(requests)]
        row_gens = [g for g in gens for _ in range(rows)]
        before = timed(lambda: per_row_draws(logits, params, row_gens), args.repeats)
        after = timed(lambda: sample(logits, params, row_gens), args.repeats)
        print(
            f"| {requests} | {rows} | {requests * rows} | {before:.3f} | {after:.3f} | {before / after:.1f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
