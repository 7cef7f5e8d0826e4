"""A target split over tensor-parallel ranks (Megatron's layout): each rank holds its share of the attention heads
(q, k and v by head; the KV heads are memd's per-rank pool) and of the MLP's intermediate width. q|k|v and gate|up are
split by output rows (column-parallel), o_proj and down_proj by input columns (row-parallel), so a layer needs one
all-reduce after attention and one after the MLP; the rest (embeddings, norms, LM head) is replicated on every rank.
A row-parallel bias is kept on rank 0 alone, so that the all-reduce adds it once. A DFLASH draft splits the same
way (shard_draft): its layers' heads and MLP width per rank, its fc and norms replicated; each rank's draft pool then
holds the K/V of its own heads."""

import copy
from dataclasses import dataclass

import torch

from modeld.model.causal_lm import head_dim_of


@dataclass(frozen=True)
class TensorParallel:
    rank: int
    size: int
    group: object = None  # the torch.distributed process group the ranks all-reduce over (None: the default group)


def shard_config(cfg, size: int):
    """One rank's config: heads, KV heads and intermediate width divided by `size` (ValueError if any does not
    split evenly); head_dim kept as the whole model's."""
    for name in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
        if getattr(cfg, name) % size:
            raise ValueError(f"the target's {name} {getattr(cfg, name)} does not split over {size} ranks")
    shard = copy.deepcopy(cfg)
    shard.head_dim = head_dim_of(cfg)
    shard.num_attention_heads = cfg.num_attention_heads // size
    shard.num_key_value_heads = cfg.num_key_value_heads // size
    shard.intermediate_size = cfg.intermediate_size // size
    return shard


def shard_state(state: dict, cfg, tp: TensorParallel) -> dict:
    """Rank tp.rank's part of a fused state dict (causal_lm.fuse_checkpoint's names) of the whole model `cfg`."""
    d = head_dim_of(cfg)
    q, kv, inter = cfg.num_attention_heads * d, cfg.num_key_value_heads * d, cfg.intermediate_size
    out = dict(state)
    for i in range(cfg.num_hidden_layers):
        prefix = f"model.layers.{i}."
        for kind in ("weight", "bias"):
            name = f"{prefix}self_attn.qkv_proj.{kind}"
            if name in state:
                out[name] = torch.cat([_rows(part, tp) for part in state[name].split((q, kv, kv))])
            name = f"{prefix}mlp.gate_up_proj.{kind}"
            if name in state:
                out[name] = torch.cat([_rows(part, tp) for part in state[name].split((inter, inter))])
        for proj in ("self_attn.o_proj", "mlp.down_proj"):
            out[f"{prefix}{proj}.weight"] = _rows(state[f"{prefix}{proj}.weight"].t(), tp).t().contiguous()
            bias = f"{prefix}{proj}.bias"
            if bias in state and tp.rank:
                out[bias] = torch.zeros_like(state[bias])
    return out


def _rows(t: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    return t.chunk(tp.size)[tp.rank].contiguous()


@torch.no_grad()
def shard_draft(draft, tp: TensorParallel):
    """Rank tp.rank's share of a DFLASH draft (modeld.spec.draft.DFlashDraft), in place: q/k/v and gate/up by output
    rows, o_proj and down_proj by input columns (a bias on rank 0 alone); its config the rank's heads and width
    (ValueError if any does not split evenly). Returns the draft."""
    cfg = draft.config
    for name in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
        if getattr(cfg, name) % tp.size:
            raise ValueError(f"the draft's {name} {getattr(cfg, name)} does not split over {tp.size} ranks")
    for layer in draft.layers:
        attn, mlp = layer.self_attn, layer.mlp
        for linear in (attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj):
            _keep(linear, _rows(linear.weight, tp), None if linear.bias is None else _rows(linear.bias, tp))
        for linear in (attn.o_proj, mlp.down_proj):
            bias = None if linear.bias is None else linear.bias if tp.rank == 0 else torch.zeros_like(linear.bias)
            _keep(linear, _rows(linear.weight.t(), tp).t().contiguous(), bias)
        attn.heads //= tp.size
        attn.kv_heads //= tp.size
    shard = copy.deepcopy(cfg)
    shard.num_attention_heads = cfg.num_attention_heads // tp.size
    shard.num_key_value_heads = cfg.num_key_value_heads // tp.size
    shard.intermediate_size = cfg.intermediate_size // tp.size
    draft.config = shard
    draft.tensor_parallel = tp  # the serving draft built from it all-reduces over tp's group
    return draft


def _keep(linear: torch.nn.Linear, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    linear.weight = torch.nn.Parameter(weight, requires_grad=False)
    linear.out_features, linear.in_features = weight.shape
    if bias is not None:
        linear.bias = torch.nn.Parameter(bias, requires_grad=False)
