"""Shared by kv_writer.py and kv_reader.py: the K/V rows the writer puts at each slot."""

import torch

SEED = 1234


def expected_rows(pools: dict, requests: list[dict]) -> list[tuple[str, list[int], torch.Tensor]]:
    """(pool name, slots, values [layers, 2, len(slots), heads, dim]) in a fixed order."""
    gen = torch.Generator().manual_seed(SEED)
    out = []
    for req in requests:
        for name, slots in (("target_kv", req["target_slots"]), ("draft_kv", req["draft_slots"])):
            kv = pools[name]
            shape = (kv.shape[0], 2, len(slots), kv.shape[3], kv.shape[4])
            out.append((name, slots, torch.randn(shape, generator=gen).to(kv.dtype)))
    return out
