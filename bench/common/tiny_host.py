"""A host-bound workload: a model so small that its forward is cheap (bench/configs/tiny-host, dummy weights), many
requests of random prompt ids and memd's pools sized for them (bench.engine.host_overhead,
bench.serving.grpc_streams)."""

import pathlib

import torch

TINY = pathlib.Path(__file__).parents[1] / "configs" / "tiny-host"


def random_prompts(count: int, tokens: int) -> list[list[int]]:
    """count prompts of random ids (seeded: every run and every benchmark that uses them gets the same)."""
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(100, 2000, (tokens,), generator=gen).tolist() for _ in range(count)]


def many_requests_memd_flags(requests: int) -> list[str]:
    """memd's pool flags for `requests` requests of up to 256 tokens at once (page 16, no draft)."""
    return [
        "--page-size",
        "16",
        "--max-running-requests",
        str(requests),
        "--max-total-tokens",
        str(requests * 256),
        "--draft-model",
        "none",
    ]
