"""The model identity modeld sends to memd at Attach: memd keys its prefix cache by it, so KV that one
model computed is never served to another (KV is garbage to a model with other weights, even of the same
shape).

What determines the KV: the architecture config, the dtype modeld computes in, the KV dtype, and every
weight. Hashing every byte of the weights would be exact, but reading an 8B model through the host and a
hash takes tens of seconds at start-up. So each tensor contributes its name, shape, dtype, up to
SAMPLES_PER_TENSOR of its elements at evenly spaced positions (their bits), and the sum of the bits of all its
elements as integers, computed on the tensor's device (exact, whatever the order of summation: the same
weights give the same fingerprint on any device or thread count). The trade-off: two models that differ only
at unsampled elements, by changes whose bit patterns sum to zero, get the same fingerprint. Weights that
differ by training, fine-tuning, quantisation or another seed never do that by chance; the fingerprint guards
against mistakes, and memd never shows it (Capacity and its log show a keyed digest): a client joins a model's prefix
cache only by computing the fingerprint from the same weights. Every attached client maps the pools and can
write any KV byte anyway, so this is defence in depth among clients of one user (docs/architecture.md, "Trust").
"""

import hashlib
import json

import torch

SAMPLES_PER_TENSOR = 1 << 16
SUM_CHUNK = 1 << 24  # elements summed at a time (each chunk is widened to int64: 128 MiB)
BITS_AS_INTEGERS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}  # element size -> dtype


def model_fingerprint(model: torch.nn.Module, hf_config, dtype: str, kv_dtype: str) -> str:
    """32 hex digits (blake2b-128) over the config, the dtypes and every tensor of the model's state."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(_config_text(hf_config).encode())
    digest.update(f"\0dtype={dtype}\0kv_dtype={kv_dtype}\0".encode())
    with torch.no_grad():
        for name, tensor in sorted(model.state_dict().items()):
            bits = tensor.detach().reshape(-1).view(BITS_AS_INTEGERS[tensor.element_size()])
            digest.update(f"{name}\0{tuple(tensor.shape)}\0{tensor.dtype}\0{_bit_sum(bits)}\0".encode())
            digest.update(_sample(bits).cpu().numpy().tobytes())
    return digest.hexdigest()


def _config_text(hf_config) -> str:
    """The config as canonical JSON, without what names where it was loaded from (a copy of the same model in
    another folder is the same model)."""
    fields = {
        key: value
        for key, value in hf_config.to_dict().items()
        if not key.startswith("_") and key != "transformers_version"
    }
    return json.dumps(fields, sort_keys=True, default=str)


def _sample(bits: torch.Tensor) -> torch.Tensor:
    """Up to SAMPLES_PER_TENSOR elements at evenly spaced positions (all of them when there are no more)."""
    count = bits.numel()
    if count <= SAMPLES_PER_TENSOR:
        return bits
    positions = torch.arange(SAMPLES_PER_TENSOR, device=bits.device, dtype=torch.int64) * count // SAMPLES_PER_TENSOR
    return bits[positions]


def _bit_sum(bits: torch.Tensor) -> int:
    """The sum of every element's bits read as an integer (exact: integer arithmetic, in int64 per chunk)."""
    return sum(int(chunk.sum(dtype=torch.int64)) for chunk in bits.split(SUM_CHUNK))
