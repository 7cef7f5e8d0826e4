"""The collective the layers of a tensor-parallel rank run (modeld.model.tensor_parallel), and what its failure
means."""

import torch


class RankLost(RuntimeError):
    """A tensor-parallel rank is gone: no forward can run without it, so the engine stops."""


def all_reduce(partial: torch.Tensor, tensor_parallel) -> torch.Tensor:
    """A row-parallel projection's output summed over the ranks of `tensor_parallel` (a TensorParallel: in place);
    itself without one. A collective whose peer is gone fails with a RuntimeError: RankLost."""
    if tensor_parallel is not None:
        try:
            torch.distributed.all_reduce(partial, group=tensor_parallel.group)
        except RuntimeError as exc:
            raise RankLost(f"an all-reduce over the tensor-parallel ranks failed: {exc}") from None
    return partial
