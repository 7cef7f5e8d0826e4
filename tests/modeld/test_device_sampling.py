"""Sampling and DFLASH acceptance on the device against host versions of the same rules (the engine's code before
it moved to the device): the same tokens for the same logits and generators, on every device this machine has."""

import pytest
import torch

from modeld.dflash import accept_lengths
from modeld.sampling import InvalidRequest, SamplingParams, filtered_probs, sample

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def host_sample(logits, params, generators) -> list[int]:
    """One token per row, decided row by row on the host."""
    out = logits.argmax(dim=-1).tolist()
    for i, p in enumerate(params):
        if not p.greedy:
            out[i] = int(torch.multinomial(filtered_probs(logits[i], p), 1, generator=generators[i]).item())
    return out


def host_accept(drafts: list[int], target: list[int]) -> list[int]:
    """The accepted drafts (the longest prefix equal to the target's tokens), then the bonus."""
    a = 0
    while a < len(drafts) and drafts[a] == target[a]:
        a += 1
    return drafts[:a] + [target[a]]


def generators(device, seeds):
    return [None if s is None else torch.Generator(device=device).manual_seed(s) for s in seeds]


@pytest.mark.parametrize("device", DEVICES)
def test_sample_on_device_equals_host_rules(device):
    torch.manual_seed(0)
    logits = (torch.randn(6, 500) * 3).to(device)
    params = [SamplingParams(temperature=0), SamplingParams(temperature=0.7, top_k=20, seed=1),
              SamplingParams(temperature=1.0, top_p=0.9, seed=2), SamplingParams(temperature=1.3, seed=3),
              SamplingParams(temperature=0.5, top_k=1), SamplingParams(temperature=0.9, top_k=50, top_p=0.8, seed=4)]
    seeds = [None, 11, 12, 13, None, 14]
    for _ in range(5):  # several draws: the generators advance the same way on both paths
        dev_gens, host_gens = generators(device, seeds), generators(device, seeds)
        got = sample(logits, params, dev_gens)
        assert got.device.type == device and got.dtype == torch.int64
        assert got.tolist() == host_sample(logits, params, host_gens)
        logits = logits.roll(7, dims=1)


@pytest.mark.parametrize("device", DEVICES)
def test_accept_lengths_equal_the_host_rule(device):
    gen = torch.Generator().manual_seed(5)
    block, n = 8, 200
    target = torch.randint(0, 4, (n, block), generator=gen)  # a small vocabulary: long accepted prefixes happen
    drafts = torch.where(torch.rand(n, block - 1, generator=gen) < 0.8, target[:, :-1],
                         torch.randint(0, 4, (n, block - 1), generator=gen))
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
