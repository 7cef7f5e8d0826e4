"""The DFLASH draft (z-lab format): Qwen3-style layers without embedding or lm_head, conditioned by
"KV injection": the target's tapped hidden states, projected by fc + hidden_norm, go through every
draft layer's k_proj / v_proj (+ k_norm + RoPE at the token's position) into the draft KV pool.

A draft block [last token, mask x (B-1)] is one forward whose queries see the context K/V in the
draft pool (sliding layers: their window, read through the target->draft mapping) and the block's
own K/V (never stored). The block is bidirectional unless the config says causal.
"""

import pathlib
from dataclasses import dataclass

import torch
from torch import nn
from transformers import Qwen3Config
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from modeld.kernels.draft_attention import draft_attention
from modeld.kernels.fused import rotate_half
from modeld.model.causal_lm import MLP, RMSNorm
from modeld.model.loader import safetensors_state


class DraftError(ValueError):
    """A draft that cannot be loaded, or does not fit the target."""


@dataclass(frozen=True)
class DraftSpec:
    block_size: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    windows: tuple[int | None, ...]  # per layer: sliding window (HF semantics) or None for full attention
    causal: bool


def read_spec(cfg: Qwen3Config, raw: dict, block_override: int | None) -> DraftSpec:
    dflash = raw.get("dflash_config") or {}
    block = block_override or dflash.get("block_size", raw.get("block_size"))
    layer_ids = dflash.get("target_layer_ids")
    mask_id = dflash.get("mask_token_id", raw.get("mask_token_id"))
    if not isinstance(block, int) or block < 2:
        raise DraftError(f"the draft needs dflash_config.block_size >= 2, got {block!r}")
    if not layer_ids:
        raise DraftError("the draft needs dflash_config.target_layer_ids")
    if not isinstance(mask_id, int):
        raise DraftError("the draft needs dflash_config.mask_token_id")
    types = raw.get("layer_types") or ["full_attention"] * cfg.num_hidden_layers
    window = raw.get("sliding_window")
    windows = tuple(window if t == "sliding_attention" else None for t in types)
    if any(t == "sliding_attention" for t in types) and not isinstance(window, int):
        raise DraftError("sliding_attention layers need an integer sliding_window")
    causal = bool(raw.get("is_causal", dflash.get("causal", False)))
    return DraftSpec(block, tuple(layer_ids), mask_id, windows, causal)


class DraftAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)

    def kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K (normed, rotated) and V of inputs x [..., hidden] -> [..., kv_heads, head_dim]."""
        k = self.k_norm(self.k_proj(x).unflatten(-1, (self.kv_heads, self.head_dim)))
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
        return k * cos + rotate_half(k) * sin, self.v_proj(x).unflatten(-1, (self.kv_heads, self.head_dim))

    def query(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Q (normed, rotated) of inputs x [..., hidden] -> [..., heads, head_dim]."""
        q = self.q_norm(self.q_proj(x).unflatten(-1, (self.heads, self.head_dim)))
        return q * cos.unsqueeze(-2) + rotate_half(q) * sin.unsqueeze(-2)

    def forward(self, h, cos, sin, ctx_k, ctx_v, ctx_visible, causal: bool):
        """h [N, B, hidden]; ctx_k/v [N, C, kv_heads, head_dim]; ctx_visible [N, B, C] bool."""
        q = self.query(h, cos, sin)
        k_blk, v_blk = self.kv(h, cos, sin)
        out = draft_attention(q, k_blk, v_blk, ctx_k, ctx_v, ctx_visible, causal, self.head_dim**-0.5)
        return self.o_proj(out.flatten(-2))


class DraftLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.self_attn = DraftAttention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class DFlashDraft(nn.Module):
    tensor_parallel = None  # a rank's share of the draft (modeld.model.tensor_parallel.shard_draft): its TensorParallel

    def __init__(self, cfg: Qwen3Config, spec: DraftSpec, target_hidden: int):
        super().__init__()
        self.config, self.spec = cfg, spec
        self.fc = nn.Linear(len(spec.target_layer_ids) * target_hidden, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DraftLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(cfg)

    def rope(self, x: torch.Tensor, positions: torch.Tensor):
        cos, sin = self.rotary_emb(x, positions.reshape(1, -1))
        return cos.reshape(*positions.shape, -1), sin.reshape(*positions.shape, -1)

    def context_kv(self, taps: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per draft layer, the K/V that committed tokens leave in the draft pool.
        taps: [T, K * target_hidden] (the tapped target layers, concatenated); positions [T]."""
        ctx = self.hidden_norm(self.fc(taps))
        cos, sin = self.rope(ctx, positions)
        return [layer.self_attn.kv(ctx, cos, sin) for layer in self.layers]

    def block_hidden(self, embeds, positions, contexts) -> torch.Tensor:
        """embeds [N, B, hidden] (the target's embedding of the block), positions [N, B];
        contexts: per layer (ctx_k, ctx_v, ctx_visible). Returns the final hidden states [N, B, hidden]."""
        h = embeds
        cos, sin = self.rope(h, positions)
        for layer, (ctx_k, ctx_v, visible) in zip(self.layers, contexts):
            h = h + layer.self_attn(layer.input_layernorm(h), cos, sin, ctx_k, ctx_v, visible, self.spec.causal)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.norm(h)


def load_draft(
    folder: str, target_cfg, dtype: torch.dtype, device: str, block_override: int | None = None, dummy: bool = False
) -> DFlashDraft:
    """Load a z-lab format draft and check that it fits the target; `dummy`: seeded random weights from its
    config.json alone (benchmarks of the draft's cost at real sizes)."""
    import json

    path = pathlib.Path(folder)
    try:
        raw = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise DraftError(f"cannot read the draft's config.json in {folder}: {exc}") from None
    cfg = Qwen3Config(**{k: v for k, v in raw.items() if k not in ("architectures", "model_type", "auto_map")})
    spec = read_spec(cfg, raw, block_override)
    if cfg.hidden_size != target_cfg.hidden_size:
        raise DraftError(
            f"the draft's hidden_size {cfg.hidden_size} differs from the target's {target_cfg.hidden_size}"
        )
    if not 0 <= spec.mask_token_id < target_cfg.vocab_size:
        raise DraftError(
            f"the draft's mask_token_id {spec.mask_token_id} is outside the target vocabulary [0, "
            f"{target_cfg.vocab_size})"
        )
    bad = [i for i in spec.target_layer_ids if not 0 <= i < target_cfg.num_hidden_layers]
    if bad:
        raise DraftError(f"target_layer_ids {bad} do not exist in a target of {target_cfg.num_hidden_layers} layers")
    if dummy:
        with torch.device(device):
            model = DFlashDraft(cfg, spec, target_cfg.hidden_size).to(dtype)
        gen = torch.Generator(device=device).manual_seed(1)
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(
                    torch.ones_like(p)
                    if name.endswith("norm.weight")
                    else torch.randn(p.shape, generator=gen, device=device) * 0.02
                )
        return model.eval()
    try:
        state = {k.removeprefix("model."): v for k, v in safetensors_state(path).items()}
    except FileNotFoundError as exc:
        raise DraftError(f"the draft: {exc}") from None
    fc = state.get("fc.weight")
    want = len(spec.target_layer_ids) * target_cfg.hidden_size
    if fc is None or fc.shape[1] != want:
        raise DraftError(
            f"the draft's fc takes {None if fc is None else fc.shape[1]} inputs, but "
            f"{len(spec.target_layer_ids)} tapped layers x hidden {target_cfg.hidden_size} = {want}"
        )
    with torch.device(device):
        model = DFlashDraft(cfg, spec, target_cfg.hidden_size).to(dtype)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise DraftError(f"draft checkpoint does not fit: missing {missing[:6]}, unexpected {unexpected[:6]}")
    return model.eval()


def load_served_draft(cfg, target_cfg, dtype: str, tensor_parallel=None) -> DFlashDraft:
    """The draft modeld's config (a ModeldConfig) names, in `dtype`, for its target; with `tensor_parallel` (a
    modeld.model.tensor_parallel.TensorParallel) that rank's share of it."""
    from modeld.model.tensor_parallel import shard_draft

    draft = load_draft(
        cfg.draft_model,
        target_cfg,
        getattr(torch, dtype),
        cfg.device,
        cfg.num_draft_tokens,
        dummy=cfg.load_format == "dummy",
    )
    return draft if tensor_parallel is None else shard_draft(draft, tensor_parallel)
