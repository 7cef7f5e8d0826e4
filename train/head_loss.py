"""Weighted cross-entropy through the target's frozen LM head, in chunks of rows, so that the full
[rows x vocabulary] logits never exist: each chunk's logits are made, reduced to its loss, its greedy guess and
the gradient with respect to its hidden rows, and dropped. The head is frozen, so the hidden rows' gradient is all
the backward needs, and it is computed in the forward (one more matrix product a chunk, none in the backward).
On CUDA the per-chunk arithmetic between the two matrix products is compiled into a few fused kernels: run as
separate torch operations, its passes over the fp32 logits took most of a training step's device time.
"""

import functools

import torch

CHUNK_ROWS = 8192  # rows of logits at a time: 8192 x 49,152 fp32 is 1.6 GB


def chunk_terms(
    logits: torch.Tensor, label: torch.Tensor, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sum of weight * cross-entropy, each row's argmax, d loss / d logits in the logits' dtype) of one chunk."""
    x = logits.float()
    peak = x.amax(-1, keepdim=True)
    exp = (x - peak).exp()
    total = exp.sum(-1, keepdim=True)
    picked = x.gather(1, label[:, None])
    loss = ((peak + total.log() - picked)[:, 0] * weight).sum()
    one_hot = torch.arange(x.shape[1], device=x.device)[None, :] == label[:, None]
    grad = (exp / total - one_hot.float()) * weight[:, None]  # weight * (softmax - one-hot)
    return loss, x.argmax(-1), grad.to(logits.dtype)


@functools.cache
def compiled_chunk_terms():
    return torch.compile(chunk_terms, dynamic=True)


class FrozenHeadCrossEntropy(torch.autograd.Function):
    """sum_i weight_i * CE(hidden_i @ head^T, label_i) and the argmax of each row's logits."""

    @staticmethod
    def forward(ctx, hidden, head, labels, weights, chunk_rows):
        terms = compiled_chunk_terms() if hidden.is_cuda else chunk_terms
        loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
        guesses = torch.empty(len(hidden), dtype=torch.long, device=hidden.device)
        grad = torch.empty_like(hidden) if hidden.requires_grad else None
        for begin in range(0, len(hidden), chunk_rows):
            end = min(begin + chunk_rows, len(hidden))
            logits = hidden[begin:end].to(head.dtype) @ head.T  # in the head's precision
            part, guesses[begin:end], grad_logits = terms(logits, labels[begin:end], weights[begin:end])
            loss += part
            if grad is not None:
                grad[begin:end] = (grad_logits @ head).to(hidden.dtype)
        ctx.save_for_backward(grad)
        ctx.mark_non_differentiable(guesses)
        return loss, guesses

    @staticmethod
    def backward(ctx, grad_loss, _grad_guesses):
        (grad,) = ctx.saved_tensors
        return grad * grad_loss.to(grad.dtype), None, None, None, None


def head_cross_entropy(
    hidden: torch.Tensor, head: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor, chunk_rows: int = CHUNK_ROWS
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weighted sum of the rows' cross-entropies, each row's argmax) for hidden [N, H], a frozen head [V, H],
    labels [N] and weights [N] (fp32)."""
    if head.requires_grad:
        raise ValueError("head_cross_entropy computes no gradient for the head: it must be frozen")
    return FrozenHeadCrossEntropy.apply(hidden, head, labels, weights.float(), chunk_rows)
