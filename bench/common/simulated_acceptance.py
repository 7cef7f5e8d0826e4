"""DFLASH at an accept length the real draft does not reach, for benchmarks only: verify commits a drawn number of
drafts per block, whatever the tokens are, and every other cost stays real (the draft's forward, the target's
verify forward, the acceptance's place in the step and its graphs, K/V writes and trims, memd's calls). A row run
this way says "simulated" in its name.

The draw: position k of a block (k = 1 .. block - 1) is accepted with probability rates[k - 1] once 1 .. k - 1 were,
as a draft's accepts are; the block commits the accepted drafts and the bonus token. On the device, inside the
captured graphs too (torch's CUDA generator is safe to capture)."""

import torch


class SimulatedAcceptance:
    def __init__(self, rates: list[float]):
        if not rates or not all(0.0 <= r <= 1.0 for r in rates):
            raise ValueError(f"acceptance rates must lie in [0, 1], got {rates}")
        self.rates = list(rates)
        self._on: dict[torch.device, torch.Tensor] = {}

    @classmethod
    def with_mean(cls, accept_length: float, block: int) -> "SimulatedAcceptance":
        """One rate at every position, the one whose expected tokens per verify step (bonus included) is
        `accept_length`: sum over j < block of rate^j."""
        if not 1.0 <= accept_length <= block:
            raise ValueError(f"an accept length must lie in [1, {block}] at block {block}, got {accept_length}")
        low, high = 0.0, 1.0
        for _ in range(60):  # bisection: the expectation grows with the rate
            rate = (low + high) / 2
            low, high = (rate, high) if expected_length([rate] * (block - 1)) < accept_length else (low, rate)
        return cls([(low + high) / 2] * (block - 1))

    def mean(self) -> float:
        return expected_length(self.rates)

    def __call__(self, drafts: torch.Tensor, target: torch.Tensor, live: torch.Tensor | None = None) -> torch.Tensor:
        """Committed tokens per block (int64 [N]), as modeld.kernels.accept.accept_lengths returns them."""
        n, drafted = drafts.shape
        if drafted > len(self.rates):
            raise ValueError(f"blocks of {drafted + 1} need {drafted} rates, this simulation has {len(self.rates)}")
        rates = self._on.get(drafts.device)
        if rates is None:
            rates = self._on[drafts.device] = torch.tensor(self.rates, dtype=torch.float32, device=drafts.device)
        accepted = torch.rand((n, drafted), device=drafts.device) < rates[:drafted]
        lengths = accepted.to(torch.int64).cumprod(dim=1).sum(dim=1) + 1
        return lengths if live is None else lengths * (live >= 0)


def expected_length(rates: list[float]) -> float:
    """Expected tokens per verify step: 1 (the bonus) plus the chance of accepting each position."""
    total, reach = 1.0, 1.0
    for rate in rates:
        reach *= rate
        total += reach
    return total


def simulate(engine, acceptance: SimulatedAcceptance) -> None:
    """The engine's DFLASH worker verifies by `acceptance` from now on; its graphs are captured again with it."""
    worker = engine.runner.spec
    if worker is None:
        raise ValueError("a simulated acceptance needs an engine with a DFLASH draft")
    worker.accept = acceptance
    if worker.graphs is not None:
        worker.graphs.capture(worker)
