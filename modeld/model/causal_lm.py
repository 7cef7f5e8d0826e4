"""The target's forward over memd's paged KV pools: Llama, Qwen2 and Qwen3 decoder LMs.

Numerics follow Hugging Face's (fp32 RMSNorm statistics, cos/sin in fp32 cast to the activation dtype), which is what
the logits tests compare against. For speed the layers run fused: one q|k|v and one gate|up projection (the
checkpoint's separate matrices are concatenated at load, `fuse_checkpoint`), residual add + RMSNorm in one kernel,
rotary from a table computed once and applied in the launch that writes K/V into the pool, and every step's shapes
free of host syncs, so a decode forward can be captured in a CUDA graph (modeld/runner/graphs.py). A layer's projections
of at most 16 rows on a GPU (a batch-1 decode step, one request's DFLASH block) run the skinny Triton kernel where it
beats cuBLAS (modeld/kernels/skinny_linear.py), with the residual add + RMSNorm before q|k|v and gate|up and the
SiLU-mul after gate|up inside it (modeld/kernels/norm_linear.py), and without q/k norms the rotary and K/V write
after q|k|v too (modeld/kernels/norm_qkv_rotary.py): five launches a layer; more rows, cuBLAS.
"""

from dataclasses import dataclass

import torch
from torch import nn
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from modeld.kernels.attention import paged_attention
from modeld.kernels.fused import rms_norm
from modeld.kernels.norm_linear import norm_project
from modeld.kernels.norm_qkv_rotary import norm_qkv_rotary
from modeld.kernels.rotary_store import rotary_store
from modeld.kernels.skinny_linear import linear
from modeld.model.collectives import all_reduce

SUPPORTED_FAMILIES = ("llama", "qwen2", "qwen3")


@dataclass
class ForwardBatch:
    """One forward over B requests whose new tokens are packed back to back (T tokens)."""

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    out_slots: torch.Tensor  # [T] target slots the new tokens' K/V go to (< 0: write nothing)
    rows: torch.Tensor  # [B] rows of req_to_token
    q_starts: torch.Tensor  # [B] position of each request's first new token
    q_lens: torch.Tensor  # [B] new tokens per request
    kv_lens: torch.Tensor  # [B] positions with K/V after this forward (q_start + q_len)
    req_to_token: torch.Tensor  # memd's shared table
    qo_indptr: torch.Tensor | None = None  # [B] first token of each request in the packed T (cumsum of q_lens if None)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)

    def fused(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual) in one kernel; without residual, (norm(x), x)."""
        return rms_norm(x, self.weight, self.eps, residual)


class RowLinear(nn.Linear):
    """nn.Linear whose few-row inputs on a GPU go through the skinny kernel while `skinny` is on (CausalLM's switch)."""

    skinny = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self.skinny)


def head_dim_of(cfg) -> int:
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


class Attention(nn.Module):
    def __init__(self, cfg, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = head_dim_of(cfg)
        self.scale = self.head_dim**-0.5
        bias = cfg.model_type == "qwen2" or bool(getattr(cfg, "attention_bias", False))
        self.split = (self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim)
        self.qkv_proj = RowLinear(cfg.hidden_size, sum(self.split), bias=bias)
        self.o_proj = RowLinear(
            self.heads * self.head_dim, cfg.hidden_size, bias=bool(getattr(cfg, "attention_bias", False))
        )
        self.qk_norm = cfg.model_type == "qwen3"
        if self.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)

    def rotate_and_store(self, qkv, cos, sin, batch: ForwardBatch, k_cache, v_cache) -> torch.Tensor:
        """The rotated q of a q|k|v projection of the normed input; its rotated k and v written to the pool."""
        T = qkv.shape[0]
        q, k, v = qkv.split(self.split, dim=-1)
        q = q.unflatten(-1, (self.heads, self.head_dim))
        k = k.unflatten(-1, (self.kv_heads, self.head_dim))
        v = v.unflatten(-1, (self.kv_heads, self.head_dim))
        if self.qk_norm:
            q = self.q_norm.fused(q.reshape(-1, self.head_dim))[0].view(T, self.heads, self.head_dim)
            k = self.k_norm.fused(k.reshape(-1, self.head_dim))[0].view(T, self.kv_heads, self.head_dim)
        return rotary_store(q, k, v, cos, sin, k_cache, v_cache, batch.out_slots)  # rotated k lands in the pool only

    def attend(self, q, batch: ForwardBatch, k_cache, v_cache) -> torch.Tensor:
        """o_proj of the attention of the rotated q [T, heads, head_dim] over the pool (the new K/V written)."""
        T = q.shape[0]
        out = paged_attention(
            q,
            k_cache,
            v_cache,
            batch.req_to_token,
            batch.rows,
            batch.q_starts,
            batch.q_lens,
            batch.kv_lens,
            self.scale,
            qo_indptr=batch.qo_indptr,
        )
        return self.o_proj(out.view(T, self.heads * self.head_dim))


class MLP(nn.Module):
    """HF's gate / up / down MLP (the DFLASH draft's layers, loaded by their checkpoint names)."""

    def __init__(self, cfg):
        super().__init__()
        bias = bool(getattr(cfg, "mlp_bias", False))
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=bias)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=bias)
        if cfg.hidden_act != "silu":
            raise ValueError(f"unsupported hidden_act {cfg.hidden_act!r}")

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class FusedMLP(nn.Module):
    """The same MLP's weights with gate|up in one matrix; DecoderLayer runs it (silu(gate) * up in one kernel, or
    inside the gate|up projection with the norm before it)."""

    def __init__(self, cfg):
        super().__init__()
        bias = bool(getattr(cfg, "mlp_bias", False))
        self.gate_up_proj = RowLinear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=bias)
        self.down_proj = RowLinear(cfg.intermediate_size, cfg.hidden_size, bias=bias)
        if cfg.hidden_act != "silu":
            raise ValueError(f"unsupported hidden_act {cfg.hidden_act!r}")


class DecoderLayer(nn.Module):
    fuse_norms = True  # few-row norms inside the skinny projection after them (CausalLM.use_skinny_linear's switch)
    # a rank's layer (modeld.model.tensor_parallel): o_proj's and down_proj's partial sums are all-reduced over it
    tensor_parallel = None

    def __init__(self, cfg, layer_id: int):
        super().__init__()
        self.self_attn = Attention(cfg, layer_id)
        self.mlp = FusedMLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, residual, cos, sin, batch, k_cache, v_cache):
        """(x, residual, entering): the layer's output is `x + residual` of the first two (the add is fused into the
        next
        norm); `entering` is the layer's input, `x + residual` of the layer before, which its input norm formed (a new
        tensor, or x itself without a residual)."""
        q, entering = self._attention_input(x, residual, cos, sin, batch, k_cache, v_cache)
        h = self._all_ranks(self.self_attn.attend(q, batch, k_cache, v_cache))
        act, residual = self._norm_project(self.post_attention_layernorm, self.mlp.gate_up_proj, h, entering, silu=True)
        return self._all_ranks(self.mlp.down_proj(act)), residual, entering

    def _all_ranks(self, partial: torch.Tensor) -> torch.Tensor:
        return all_reduce(partial, self.tensor_parallel)

    def _attention_input(self, x, residual, cos, sin, batch, k_cache, v_cache):
        """(rotated q, x + residual), the new tokens' rotated k and v written to the pool: in one launch for a few
        rows of a layer without q/k norms where it fits, else the norm + q|k|v projection, then rotary_store."""
        attn, norm = self.self_attn, self.input_layernorm
        if self.fuse_norms and attn.qkv_proj.skinny and not attn.qk_norm:
            fused = norm_qkv_rotary(
                x,
                residual,
                norm.weight,
                norm.eps,
                attn.qkv_proj.weight,
                attn.qkv_proj.bias,
                cos,
                sin,
                k_cache,
                v_cache,
                batch.out_slots,
                attn.heads,
                attn.kv_heads,
            )
            if fused is not None:
                return fused
        qkv, residual = self._norm_project(norm, attn.qkv_proj, x, residual)
        return attn.rotate_and_store(qkv, cos, sin, batch, k_cache, v_cache), residual

    def _norm_project(self, norm: RMSNorm, proj: RowLinear, x, residual, silu=False):
        return norm_project(
            x,
            residual,
            norm.weight,
            norm.eps,
            proj.weight,
            proj.bias,
            silu=silu,
            skinny=proj.skinny,
            fuse=self.fuse_norms,
        )


class Backbone(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(cfg)


def hf_rope_table(rotary_emb: nn.Module, limit: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [limit, head_dim] in fp32 for positions 0..limit-1, from HF's rotary embedding (the values it computes
    per call: an outer product of positions and frequencies)."""
    probe = torch.empty(0, dtype=torch.float32, device=device)
    cos, sin = rotary_emb(probe, torch.arange(limit, device=device)[None, :])
    return cos[0].float(), sin[0].float()


class CausalLM(nn.Module):
    """forward() writes the new tokens' K/V at batch.out_slots and returns the final
    hidden states (after the last norm); capture_layers also returns the outputs of the
    given decoder layers (DFLASH taps them)."""

    def __init__(self, cfg):
        super().__init__()
        if cfg.model_type not in SUPPORTED_FAMILIES:
            raise ValueError(f"unsupported model_type {cfg.model_type!r}: modeld runs {', '.join(SUPPORTED_FAMILIES)}")
        self.config = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if getattr(cfg, "tie_word_embeddings", False):
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rope_table: torch.Tensor | None = None  # [positions, 2, head_dim]: cos and sin in the activation dtype
        # On rank 0 of several tensor-parallel ranks, their group (modeld.engine.ranks.RankGroup): each forward is
        # announced to the other ranks first, so that they run it too and its all-reduces pair with theirs.
        self.ranks = None

    def rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, head_dim] in `dtype` (views of one gather), from a table HF's rotary embedding fills once in
        fp32 (the same values it computes per call: an outer product of positions and frequencies), cast once."""
        if self.rope_table is None or self.rope_table.dtype != dtype:
            cos, sin = hf_rope_table(self.model.rotary_emb, self.config.max_position_embeddings, positions.device)
            self.rope_table = torch.stack((cos, sin), dim=1).to(dtype)
        both = self.rope_table[positions]
        return both[:, 0], both[:, 1]

    def use_skinny_linear(self, on: bool, fuse_norms: bool = True) -> None:
        """Whether the layers' projections of a few rows run the skinny kernel (on) or cuBLAS, and whether the norms
        before q|k|v and gate|up (and the SiLU-mul after gate|up, the rotary and K/V write after q|k|v) run inside
        it; capture graphs after."""
        for module in self.modules():
            if isinstance(module, RowLinear):
                module.skinny = on
            if isinstance(module, DecoderLayer):
                module.fuse_norms = fuse_norms

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, kv_pool: torch.Tensor, capture_layers=()):
        """kv_pool: memd's target_kv buffer [layers, 2, rows, kv_heads, head_dim]."""
        if self.ranks is not None:
            return self.ranks.forward(self.rank_forward, batch, kv_pool, capture_layers)
        return self.rank_forward(batch, kv_pool, capture_layers)

    def rank_forward(self, batch: ForwardBatch, kv_pool: torch.Tensor, capture_layers=()):
        """This process's share of the forward (the whole of it without tensor parallelism)."""
        x = self.model.embed_tokens(batch.input_ids)
        if batch.qo_indptr is None:
            batch.qo_indptr = torch.cumsum(batch.q_lens, 0) - batch.q_lens
        cos, sin = self.rope(batch.positions, x.dtype)
        captured, residual = {}, None
        for i, layer in enumerate(self.model.layers):
            x, residual, entering = layer(x, residual, cos, sin, batch, kv_pool[i, 0], kv_pool[i, 1])
            if i - 1 in capture_layers:  # layer i - 1's output, as layer i's input norm summed it: no add of its own
                captured[i - 1] = entering
        x, _ = self.model.norm.fused(x, residual)
        # HF's hidden_states[L] (what a tap of the last layer means in the z-lab format) is normed.
        captured[len(self.model.layers) - 1] = x
        return x, [captured[i] for i in capture_layers]

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()


def fuse_checkpoint(state: dict, num_layers: int) -> dict:
    """HF's separate q/k/v and gate/up matrices (and biases) -> the fused qkv_proj and gate_up_proj."""
    state = dict(state)
    for i in range(num_layers):
        for parent, parts, fused in (
            ("self_attn", ("q_proj", "k_proj", "v_proj"), "qkv_proj"),
            ("mlp", ("gate_proj", "up_proj"), "gate_up_proj"),
        ):
            prefix = f"model.layers.{i}.{parent}."
            for kind in ("weight", "bias"):
                names = [f"{prefix}{p}.{kind}" for p in parts]
                if all(n in state for n in names):
                    state[f"{prefix}{fused}.{kind}"] = torch.cat([state.pop(n) for n in names])
    return state
