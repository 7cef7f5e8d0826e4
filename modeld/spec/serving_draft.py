"""The DFLASH draft's serving path: the function of modeld.spec.draft.DFlashDraft (the checkpoint's module, which
training differentiates through) computed with fused weights and kernels, as the target's layers are.

- every layer's q|k|v and gate|up in one matrix each; residual add + RMSNorm, SiLU-and-multiply, and the q/k
  norms with rotary, in one Triton launch each (modeld.kernels.fused, modeld.kernels.qk_norm_rotary; their torch
  references on the CPU);
- a block of at most 16 rows (one request's) through the target's few-row kernels where its shapes are tuned: the
  skinny projections, with the norm before gate|up and the SiLU-mul after it inside them where that measured faster
  (modeld.kernels.norm_linear: the default draft's gate|up; its q|k|v and the 8B draft's layers run the norm apart);
- cos / sin gathered together, in one launch, from a table filled once, not recomputed per call;
- the context K/V of all layers from one projection (k_proj|v_proj of every layer stacked), and one launch that
  norms (each layer's k_norm) and rotates the keys of all layers;
- the block's attention over its context, read straight from the draft pool, and over itself in one Triton launch
  per layer (modeld.kernels.draft_attention: no gathered context, concatenation, head repeat, mask or cuDNN plan;
  on the CPU a gather and the torch path).

The numerics are the reference's: RMSNorm statistics in fp32, every product and sum rounded to the activation
dtype where the reference's torch expressions round (a norm with unit weight followed by the bf16 product
with the weight rounds the same exact product once). Weights are shared with the module, not copied, except
the concatenated matrices.
"""

import torch
from torch import nn
from torch.nn import functional as F

from modeld.kernels.draft_attention import PagedContext, draft_attention
from modeld.kernels.fused import rms_norm
from modeld.kernels.norm_linear import norm_project
from modeld.kernels.qk_norm_rotary import qk_norm_rotary
from modeld.kernels.skinny_linear import linear
from modeld.model.causal_lm import hf_rope_table
from modeld.model.collectives import all_reduce
from modeld.spec.draft import DFlashDraft


def _cat(*linears: nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The weights (and biases, when the parts have them) of linears applied to one input, stacked."""
    weight = torch.cat([m.weight for m in linears])
    biases = [m.bias for m in linears]
    if all(b is None for b in biases):
        return weight, None
    if any(b is None for b in biases):
        raise ValueError("cannot stack linears of which only some have a bias")
    return weight, torch.cat(biases)


class _Layer:
    def __init__(self, layer):
        attn = layer.self_attn
        self.qkv = _cat(attn.q_proj, attn.k_proj, attn.v_proj)
        self.split = (attn.heads * attn.head_dim, attn.kv_heads * attn.head_dim, attn.kv_heads * attn.head_dim)
        self.o = attn.o_proj.weight
        self.q_norm, self.k_norm = attn.q_norm.weight, attn.k_norm.weight
        self.gate_up = _cat(layer.mlp.gate_proj, layer.mlp.up_proj)
        self.down = (layer.mlp.down_proj.weight, layer.mlp.down_proj.bias)
        self.input_norm = layer.input_layernorm.weight
        self.post_norm = layer.post_attention_layernorm.weight


class ServingDraft:
    """DFlashDraft's context_kv and block_hidden for inference (no autograd): block_hidden with the same signature,
    context_kv as every layer's K and V at once (context_kv_layers), the shape one write of the draft pool takes."""

    @torch.no_grad()
    def __init__(self, draft: DFlashDraft, max_positions: int):
        cfg = draft.config
        self.spec, self.config = draft.spec, cfg
        attn = draft.layers[0].self_attn
        self.heads, self.kv_heads, self.head_dim = attn.heads, attn.kv_heads, attn.head_dim
        self.eps = cfg.rms_norm_eps
        self.fc, self.hidden_norm, self.norm = draft.fc.weight, draft.hidden_norm.weight, draft.norm.weight
        self.layers = [_Layer(layer) for layer in draft.layers]
        # Context K/V of every layer in one product: rows [k of layer 0, k of layer 1, ..., v of layer 0, ...].
        attns = [layer.self_attn for layer in draft.layers]
        self.context_kv_weight = torch.cat([a.k_proj.weight for a in attns] + [a.v_proj.weight for a in attns])
        self.k_norms = torch.stack([a.k_norm.weight for a in attns])  # [layers, head_dim]
        cos, sin = hf_rope_table(draft.rotary_emb, max(max_positions, cfg.max_position_embeddings), self.fc.device)
        # [positions, 2, head_dim]: cos and sin side by side, so a call gathers both at once; HF computes them in fp32
        # and casts per call
        self.rope_table = torch.stack((cos, sin), dim=1).to(self.fc.dtype)
        self.skinny, self.fuse_norms = True, True
        # one rank's share of a draft split over tensor-parallel ranks (modeld.model.tensor_parallel.shard_draft): the
        # o_proj and down_proj partial sums are all-reduced over its group
        self.tensor_parallel = draft.tensor_parallel

    def use_skinny_linear(self, on: bool, fuse_norms: bool = True) -> None:
        """As CausalLM.use_skinny_linear, for the block's layers; capture graphs after."""
        self.skinny, self.fuse_norms = on, fuse_norms

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        both = self.rope_table[positions.reshape(-1)]  # one gather; cos and sin are views of its rows
        return both[:, 0], both[:, 1]

    @torch.inference_mode()
    def context_kv_layers(self, taps: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The K and V that committed tokens leave in the draft pool, of every layer: [T, layers, kv_heads, head_dim]
        each (views of one projection; DFlashDraft.context_kv's per-layer pairs stacked), what one write of the
        draft pool takes (modeld.kernels.kv_write, caches of several layers)."""
        t, layers = taps.shape[0], len(self.layers)
        ctx = rms_norm(F.linear(taps, self.fc), self.hidden_norm, self.eps)[0]
        kv = F.linear(ctx, self.context_kv_weight).view(t, 2, layers, self.kv_heads, self.head_dim)
        keys = kv[:, 0].reshape(t, layers * self.kv_heads, self.head_dim)
        cos, sin = self.rope(positions)
        # every layer's keys normed with that layer's k_norm weight, then rotated: one launch (no q heads)
        _, k = qk_norm_rotary(keys[:, :0], keys, self.k_norms[0], self.k_norms, self.eps, cos, sin)
        return k.view(t, layers, self.kv_heads, self.head_dim), kv[:, 1]

    @torch.inference_mode()
    def block_hidden(self, embeds: torch.Tensor, positions: torch.Tensor, contexts) -> torch.Tensor:
        """embeds [N, B, hidden], positions [N, B]; contexts: per layer a PagedContext (serving: the context read from
        the draft pool) or, as the module takes it, (ctx_k, ctx_v, ctx_visible [N, B, C]). Returns the final hidden
        states [N, B, hidden]."""
        n, b, hidden = embeds.shape
        cos, sin = self.rope(positions)
        x, residual = embeds.reshape(n * b, hidden), None
        for layer, context in zip(self.layers, contexts):
            qkv, residual = norm_project(
                x, residual, layer.input_norm, self.eps, *layer.qkv, skinny=self.skinny, fuse=self.fuse_norms
            )
            h = self._attention(layer, qkv, n, b, cos, sin, context)
            act, residual = norm_project(
                h,
                residual,
                layer.post_norm,
                self.eps,
                *layer.gate_up,
                silu=True,
                skinny=self.skinny,
                fuse=self.fuse_norms,
            )
            x = self._all_ranks(linear(act, *layer.down, skinny=self.skinny))
        return rms_norm(x, self.norm, self.eps, residual)[0].view(n, b, hidden)

    def _attention(self, layer: _Layer, qkv, n: int, b: int, cos, sin, context) -> torch.Tensor:
        """qkv: the layer's q|k|v projection of its normed input."""
        hd = self.head_dim
        q, k, v = qkv.split(layer.split, dim=-1)
        q, k = qk_norm_rotary(
            q.unflatten(-1, (self.heads, hd)),
            k.unflatten(-1, (self.kv_heads, hd)),
            layer.q_norm,
            layer.k_norm,
            self.eps,
            cos,
            sin,
        )
        q, k, v = q.view(n, b, self.heads, hd), k.view(n, b, self.kv_heads, hd), v.view(n, b, self.kv_heads, hd)
        if isinstance(context, PagedContext):
            out = context.attend(q, k, v, self.spec.causal, hd**-0.5)
        else:
            out = draft_attention(q, k, v, *context, self.spec.causal, hd**-0.5)
        return self._all_ranks(linear(out.reshape(n * b, self.heads * hd), layer.o, skinny=self.skinny))

    def _all_ranks(self, partial: torch.Tensor) -> torch.Tensor:
        return all_reduce(partial, self.tensor_parallel)
