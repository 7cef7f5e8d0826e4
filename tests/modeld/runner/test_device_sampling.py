"""Sampling and DFLASH acceptance on the device: the batched sampler draws from each row's filtered distribution
(checked against that distribution, computed row by row), the same tokens for a request whatever its batch, and
acceptance equal to a host version of its rule, on every device this machine has."""

import pytest
import torch

from modeld.kernels.accept import accept_lengths
from modeld.runner import sampling
from modeld.runner.sampling import draw_chunks, sample
from modeld.sampling_params import InvalidRequest, SamplingParams

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
FILTERS = [
    SamplingParams(temperature=1.0, seed=1),
    SamplingParams(temperature=0.6, seed=1),
    SamplingParams(temperature=1.0, top_k=3, seed=1),
    SamplingParams(temperature=1.3, top_p=0.7, seed=1),
    SamplingParams(temperature=0.9, top_k=4, top_p=0.8, seed=1),
]


def filtered_probs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """The distribution of one row, by the rules' definitions: temperature, then the top-k logits, then the smallest
    set of the most likely tokens whose mass reaches top_p, renormalised."""
    logits = logits.double() / p.temperature
    if p.top_k:
        kth = torch.topk(logits, p.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if p.top_p < 1:
        sorted_probs, order = probs.sort(descending=True)
        before = sorted_probs.cumsum(-1) - sorted_probs
        sorted_probs[before >= p.top_p] = 0
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    return probs / probs.sum()


def host_accept(drafts: list[int], target: list[int]) -> list[int]:
    """The accepted drafts (the longest prefix equal to the target's tokens), then the bonus."""
    a = 0
    while a < len(drafts) and drafts[a] == target[a]:
        a += 1
    return drafts[:a] + [target[a]]


def generators(device, seeds):
    return [None if s is None else torch.Generator(device=device).manual_seed(s) for s in seeds]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("params", FILTERS, ids=lambda p: f"T{p.temperature}-k{p.top_k}-p{p.top_p}")
def test_draws_follow_the_filtered_distribution(device, params):
    """40,000 draws of one row (one batch, one generator): every frequency within 0.01 of the distribution (four
    standard deviations at most), and never a token the filters cut."""
    logits = torch.tensor([2.0, 1.5, 1.4, 0.9, 0.3, 0.0, -0.5, -1.0, -2.0, 1.0])
    expected = filtered_probs(logits, params)
    n = 40_000
    gen = torch.Generator(device=device).manual_seed(7)
    got = sample(logits.to(device).expand(n, -1).contiguous(), [params] * n, [gen] * n)
    freq = torch.bincount(got.cpu(), minlength=len(logits)).double() / n
    assert (freq - expected).abs().max() < 0.01, (freq, expected)
    assert freq[expected == 0].sum() == 0


@pytest.mark.parametrize("device", DEVICES)
def test_a_request_draws_the_same_tokens_whatever_its_batch(device):
    """Each request's rows (one, or a DFLASH block's several sharing its generator) sampled alone and inside a mixed
    batch (greedy rows, other seeds, the default generator) with the generator in the same state: the same tokens,
    and the greedy rows their argmax."""
    torch.manual_seed(0)
    vocab = 3000
    requests = [
        (SamplingParams(temperature=0.8, top_p=0.95, seed=1), 21, 4),
        (SamplingParams(temperature=0), None, 2),
        (SamplingParams(temperature=1.2, top_k=40, seed=2), 22, 1),
        (SamplingParams(temperature=0.7), None, 1),
        (SamplingParams(temperature=0.9, top_k=1), None, 3),
        (SamplingParams(temperature=1.0, seed=3), 23, 5),
    ]
    logits = [(torch.randn(rows, vocab) * 4).to(device) for _, _, rows in requests]

    def gen(seed):
        return None if seed is None else torch.Generator(device=device).manual_seed(seed)

    alone = []
    for (p, seed, rows), x in zip(requests, logits):
        if seed is not None:
            alone.append(sample(x, [p] * rows, [gen(seed)] * rows).tolist())
        else:
            alone.append(x.argmax(-1).tolist() if p.greedy else None)  # the default generator: no replay alone
    gens = [gen(seed) for _, seed, _ in requests]
    batch = sample(
        torch.cat(logits),
        [p for p, _, rows in requests for _ in range(rows)],
        [g for g, (_, _, rows) in zip(gens, requests) for _ in range(rows)],
    ).tolist()
    at = 0
    for (p, seed, rows), expected in zip(requests, alone):
        if expected is not None:
            assert batch[at : at + rows] == expected
        at += rows


@pytest.mark.parametrize("device", DEVICES)
def test_chunks_of_a_large_batch_draw_what_one_chunk_draws(device, monkeypatch):
    """A batch drawn in several chunks (runs of a generator never split) gives the tokens of one draw."""
    torch.manual_seed(1)
    logits = (torch.randn(40, 500) * 3).to(device)
    params = [SamplingParams(temperature=0.9, top_p=0.9, seed=i // 8) for i in range(40)]
    seeds = range(5)

    def draw():
        gens = {s: torch.Generator(device=device).manual_seed(100 + s) for s in seeds}
        return sample(logits, params, [gens[p.seed] for p in params]).tolist()

    one = draw()
    monkeypatch.setattr(sampling, "DRAW_CHUNK_ROWS", 12)
    assert draw() == one


def test_chunks_keep_runs_of_a_generator_whole():
    a, b, c = object(), object(), object()
    gens = [a] * 5 + [b] * 5 + [c] * 3
    assert draw_chunks(list(range(13)), gens) == [list(range(13))]
    chunked = sampling.DRAW_CHUNK_ROWS
    try:
        sampling.DRAW_CHUNK_ROWS = 8
        assert draw_chunks(list(range(13)), gens) == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9, 10, 11, 12]]
        assert draw_chunks([0, 1, 7, 8], [a, a, None, None, None, None, None, c, c]) == [[0, 1, 7, 8]]
    finally:
        sampling.DRAW_CHUNK_ROWS = chunked


@pytest.mark.parametrize("device", DEVICES)
def test_accept_lengths_equal_the_host_rule(device):
    gen = torch.Generator().manual_seed(5)
    block, n = 8, 200
    target = torch.randint(0, 4, (n, block), generator=gen)  # a small vocabulary: long accepted prefixes happen
    drafts = torch.where(
        torch.rand(n, block - 1, generator=gen) < 0.8,
        target[:, :-1],
        torch.randint(0, 4, (n, block - 1), generator=gen),
    )
    lengths = accept_lengths(drafts.to(device), target.to(device)).tolist()
    seen = set()
    for i in range(n):
        expected = host_accept(drafts[i].tolist(), target[i].tolist())
        assert lengths[i] == len(expected) and target[i, : lengths[i]].tolist() == expected
        seen.add(lengths[i])
    assert {1, block} <= seen, "the cases never covered nothing accepted and everything accepted"


@pytest.mark.parametrize("temperature", [float("nan"), float("inf"), -1.0, -1e-30])
def test_non_finite_or_negative_temperature_is_invalid(temperature):
    with pytest.raises(InvalidRequest, match="temperature"):
        SamplingParams(temperature=temperature)


@pytest.mark.parametrize("temperature", [1e-37, 1e-30, 9e-6])
def test_tiny_temperatures_sample_the_argmax_without_overflow(temperature):
    logits = torch.randn(3, 100) * 50
    params = [SamplingParams(temperature=temperature, seed=1)] * 3
    got = sample(logits, params, generators("cpu", [1, 2, 3]))
    assert got.tolist() == logits.argmax(-1).tolist()
