"""The sampler (greedy, temperature, top-k, top-p) for the parameters of modeld.sampling_params."""

import torch

from modeld.kernels.argmax import argmax_rows
from modeld.sampling_params import SamplingParams

DRAW_CHUNK_ROWS = 256  # rows drawn together: bounds the [rows, vocab] temporaries of a large DFLASH batch


def sample(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> torch.Tensor:
    """One token per row of logits [R, V] (fp32), as an int64 tensor on the logits' device: nothing here waits for
    the device. Greedy rows take the argmax; the rows that sample are drawn together (draw_rows), each from its
    own filtered distribution with noise from its request's generator, so a seeded request samples the same
    tokens whatever it is batched with."""
    out = argmax_rows(logits)
    rows = [i for i, p in enumerate(params) if not p.greedy]
    for chunk in draw_chunks(rows, generators):
        whole = len(chunk) == len(params)  # every row samples: no gather
        index = slice(None) if whole else torch.tensor(chunk, dtype=torch.int64, device=logits.device)
        out[index] = draw_rows(logits[index], [params[i] for i in chunk], [generators[i] for i in chunk])
    return out


def draw_chunks(rows: list[int], generators: list[torch.Generator | None]) -> list[list[int]]:
    """The sampled rows in chunks of about DRAW_CHUNK_ROWS, never splitting a run of rows that share a generator
    (one noise draw per run: a request's draw stays the same whatever its batch)."""
    chunks = [[]]
    for begin, end in generator_runs([generators[i] for i in rows]):
        if chunks[-1] and len(chunks[-1]) + end - begin > DRAW_CHUNK_ROWS:
            chunks.append([])
        chunks[-1].extend(rows[begin:end])
    return [c for c in chunks if c]


def generator_runs(generators: list[torch.Generator | None]) -> list[tuple[int, int]]:
    """[begin, end) of each run of consecutive entries that share one generator (None: the default one)."""
    cuts = [i for i in range(1, len(generators)) if generators[i] is not generators[i - 1]]
    bounds = [0, *cuts, len(generators)] if generators else []
    return list(zip(bounds, bounds[1:]))


def draw_rows(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> torch.Tensor:
    """A sample of every row of logits [R, V] from its distribution after temperature, top-k (exactly the k
    largest logits; ties at the k-th broken by the sort) and top-p (the smallest prefix of the sorted
    probabilities whose mass reaches top_p), in a fixed number of batched kernels plus one noise draw per run of
    rows sharing a generator (a DFLASH block's rows are one run). The draw is the exponential race: argmax of
    p_i / E_i with E_i ~ Exp(1) i.i.d. picks i with probability p_i / sum(p)."""
    vocab = logits.shape[-1]
    settings = torch.tensor(
        [[p.temperature, p.top_k or vocab, p.top_p if p.top_p < 1 else 2.0] for p in params], dtype=torch.float32
    ).to(logits.device, non_blocking=True)  # top_p 2: nothing is cut
    scaled = logits.float() / settings[:, :1]
    order = None
    if any(p.top_k or p.top_p < 1 for p in params):
        scaled, order = scaled.sort(dim=-1, descending=True)
        rank = torch.arange(vocab, dtype=torch.float32, device=logits.device)
        scaled = scaled.masked_fill(rank >= settings[:, 1:2], float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if order is not None:
        before = probs.cumsum(dim=-1) - probs  # mass strictly before each token: the first token is always kept
        probs = probs.masked_fill(before >= settings[:, 2:3], 0.0)
    noise = torch.empty_like(probs)
    for begin, end in generator_runs(generators):
        noise[begin:end].exponential_(generator=generators[begin])
    if order is not None:
        noise = noise.gather(1, order)  # each token keeps its own noise, sorted or not: draws independent of the batch
    choice = argmax_rows(probs / noise.clamp_(min=torch.finfo(torch.float32).tiny))  # E = 0 would make 0 / 0
    return choice if order is None else order.gather(1, choice[:, None])[:, 0]
