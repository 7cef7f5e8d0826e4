"""The target's forward over memd's paged KV pools: Llama, Qwen2 and Qwen3 decoder LMs.

Module and parameter names follow Hugging Face's (model.layers.N.self_attn.q_proj, ...) so a
checkpoint's state dict loads as it is. Numerics follow HF's too (fp32 RMSNorm statistics,
cos/sin in fp32 cast to the activation dtype), which is what the logits tests compare against.
"""

from dataclasses import dataclass

import torch
from torch import nn
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from modeld.kernels.attention import paged_attention
from modeld.kernels.kv_write import store_kv

SUPPORTED_FAMILIES = ("llama", "qwen2", "qwen3")


@dataclass
class ForwardBatch:
    """One forward over B requests whose new tokens are packed back to back (T tokens)."""

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    out_slots: torch.Tensor  # [T] target slots the new tokens' K/V go to
    rows: torch.Tensor  # [B] rows of req_to_token
    q_starts: torch.Tensor  # [B] position of each request's first new token
    q_lens: torch.Tensor  # [B] new tokens per request
    kv_lens: torch.Tensor  # [B] positions with K/V after this forward (q_start + q_len)
    req_to_token: torch.Tensor  # memd's shared table


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


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.scale = self.head_dim**-0.5
        bias = cfg.model_type == "qwen2" or bool(getattr(cfg, "attention_bias", False))
        self.q_proj = nn.Linear(cfg.hidden_size, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, cfg.hidden_size, bias=bool(getattr(cfg, "attention_bias", False)))
        self.qk_norm = cfg.model_type == "qwen3"
        if self.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, batch: ForwardBatch, k_cache, v_cache) -> torch.Tensor:
        T = x.shape[0]
        q = self.q_proj(x).view(T, self.heads, self.head_dim)
        k = self.k_proj(x).view(T, self.kv_heads, self.head_dim)
        v = self.v_proj(x).view(T, self.kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = cos[:, None, :], sin[:, None, :]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        store_kv(k_cache, v_cache, batch.out_slots, k, v)
        out = paged_attention(
            q, k_cache, v_cache, batch.req_to_token, batch.rows, batch.q_starts, batch.q_lens, batch.kv_lens, self.scale
        )
        return self.o_proj(out.reshape(T, self.heads * self.head_dim))


class MLP(nn.Module):
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


class DecoderLayer(nn.Module):
    def __init__(self, cfg, layer_id: int):
        super().__init__()
        self.self_attn = Attention(cfg, layer_id)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, batch, k_cache, v_cache):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, batch, k_cache, v_cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(cfg)


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

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, kv_pool: torch.Tensor, capture_layers=()):
        """kv_pool: memd's target_kv buffer [layers, 2, rows, kv_heads, head_dim]."""
        x = self.model.embed_tokens(batch.input_ids)
        cos, sin = self.model.rotary_emb(x, batch.positions[None, :])
        cos, sin = cos[0], sin[0]
        captured = {}
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, batch, kv_pool[i, 0], kv_pool[i, 1])
            if i in capture_layers:
                captured[i] = x
        x = self.model.norm(x)
        # HF's hidden_states[L] (what a tap of the last layer means in the z-lab format) is normed.
        captured[len(self.model.layers) - 1] = x
        return x, [captured[i] for i in capture_layers]

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()
