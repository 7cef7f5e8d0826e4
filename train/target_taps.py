"""The target's tapped hidden states over a training batch's context rows, the sequences packed one after another.

Each row attends causally within its own sequence (train.block_layout's CONTEXT mask) at its position in that
sequence, so a row's states are exactly those of the sequence run alone: no padding to the longest sequence, and
only the layers up to the deepest tap run. The layers are the Hugging Face model's own modules (Llama, Qwen2 and
Qwen3 decoder layers: projections, their optional q/k norms, rotary embedding, MLP); only the attention is ours,
through train.packed_attention, so that one fixed-shape function holds the whole forward and compiles once.
"""

import functools
import sys

import torch


def check_supported(target) -> None:
    """Refuse, with the reason, a target whose decoder layers are not the Llama family's."""
    model = getattr(target, "model", None)
    layer = getattr(model, "layers", [None])[0]
    attention = getattr(layer, "self_attn", None)
    needed = [
        getattr(model, "embed_tokens", None),
        getattr(model, "rotary_emb", None),
        attention,
        getattr(layer, "mlp", None),
        getattr(layer, "input_layernorm", None),
        getattr(layer, "post_attention_layernorm", None),
    ]
    needed += [getattr(attention, name, None) for name in ("q_proj", "k_proj", "v_proj", "o_proj")]
    rotary = getattr(sys.modules.get(type(attention).__module__), "apply_rotary_pos_emb", None)
    if any(part is None for part in needed) or rotary is None:
        raise ValueError(
            f"{type(target).__name__}: the trainer runs Llama-family decoder layers (embed_tokens, "
            "rotary_emb, q/k/v/o projections, input and post-attention norms, MLP)"
        )


def tapped_states(target, ids: torch.Tensor, positions: torch.Tensor, mask, attend, layer_ids) -> torch.Tensor:
    """[rows, taps x hidden]: the output of each layer in `layer_ids` at every row, concatenated (a tap at the last
    layer is after the final norm, as the model's hidden_states has it). ids, positions: [rows]; mask: the CONTEXT
    mask as `attend` (packed_attention.flex, flex_dynamic or dense) takes it."""
    model = target.model
    h = model.embed_tokens(ids)
    cos, sin = model.rotary_emb(h[None], positions[None])
    deepest, last = max(layer_ids), len(model.layers) - 1
    taps = {}
    for index, layer in enumerate(model.layers[: deepest + 1]):
        attn = layer.self_attn
        x = layer.input_layernorm(h)
        q, k, v = (proj(x).unflatten(-1, (-1, attn.head_dim)) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
        if hasattr(attn, "q_norm"):  # Qwen3: RMSNorm over each head before the rotary embedding
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = rotary_of(attn)(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
        out = attend(q[0].transpose(0, 1), k[0].transpose(0, 1), v, mask, attn.head_dim**-0.5)
        h = h + attn.o_proj(out.flatten(-2))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
        if index in layer_ids:
            taps[index] = model.norm(h) if index == last else h
    return torch.cat([taps[i] for i in layer_ids], dim=-1)


def rotary_of(attention):
    """The rotary embedding function of the attention module's own model file."""
    return sys.modules[type(attention).__module__].apply_rotary_pos_emb


@functools.cache
def compiled_tapped_states():
    """tapped_states compiled for a training step's fixed shapes (the context rows): the target's norms, rotary
    embedding and MLP fused around its matrix products, flex attention inside, one graph instead of hundreds of
    launches a step."""
    return torch.compile(tapped_states, dynamic=False)
