"""Tiny models written to disk for the DFLASH end-to-end tests: a random Qwen3 target saved with Hugging
Face's save_pretrained (safetensors, float32, no tokenizer), and DFLASH drafts in the z-lab checkpoint
format (config.json with dflash_config, model.safetensors without a "model." prefix, embeddings or lm_head).

Two kinds of target:
- `write_random_target`: every weight random; the output depends on the whole context and the draft
  (random too) is almost never accepted, so speculation runs its rejection path.
- `write_friendly_target`: a small-vocabulary target dominated by a bigram map `next_token` (orthonormal
  embeddings, lm_head row next_token[t] aligned with token t's embedding) plus random layers that perturb
  it. Every draft block position other than the anchor gets the mask token's embedding, so a draft whose
  own layers are small proposes next_token[mask] = SINK at every position; SINK maps to itself, so runs of
  SINK get drafts accepted (greedy) or accepted with a high probability (sampling).
"""

import json
import pathlib

import torch
from safetensors.torch import save_file
from transformers import Qwen3Config, Qwen3ForCausalLM

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE = 64, 4, 2, 16, 128
TARGET_LAYERS = 4


def _target_config(vocab: int, context: int) -> Qwen3Config:
    cfg = Qwen3Config(
        vocab_size=vocab,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=TARGET_LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=context,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        hidden_act="silu",
        attention_bias=False,
    )
    cfg.torch_dtype = "float32"
    cfg.dtype = "float32"
    return cfg


def _save_target(model: Qwen3ForCausalLM, folder: pathlib.Path) -> pathlib.Path:
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    # memd reads the KV dtype from config.json: make sure "float32" is there under both spellings.
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    cfg["torch_dtype"] = cfg["dtype"] = "float32"
    path.write_text(json.dumps(cfg, indent=2))
    return folder


@torch.no_grad()
def write_random_target(
    folder: pathlib.Path,
    *,
    vocab: int = 512,
    context: int = 4096,
    seed: int = 0,
    std: float = 0.15,
    embed_std: float = 1.0,
    head_std: float = 2.0,
) -> pathlib.Path:
    """A random Qwen3 (4 layers, hidden 64, 4 heads, 2 KV heads, head_dim 16). The weights are larger than
    an initialiser's so that logits are well apart (greedy never hangs on a float near-tie) and attention
    moves the output (a wrong KV row changes the continuation)."""
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(_target_config(vocab, context)).float().eval()
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
        elif "embed_tokens" in name:
            p.copy_(embed_std * torch.randn(p.shape, generator=gen))
        elif name == "lm_head.weight":
            p.copy_(head_std * torch.randn(p.shape, generator=gen))
        else:
            p.copy_(std * torch.randn(p.shape, generator=gen))
    return _save_target(model, folder)


FRIENDLY_VOCAB = 16
SINK = 3  # next_token[SINK] == SINK
FRIENDLY_MASK = 15  # next_token[FRIENDLY_MASK] == SINK: the friendly draft's proposal


def friendly_next_token(vocab: int = FRIENDLY_VOCAB, seed: int = 0) -> list[int]:
    """The bigram map: a random tree rooted at SINK (every chain of next tokens ends in SINK, the only
    fixed point, so no other cycle attracts greedy decoding); the mask token maps to SINK directly."""
    gen = torch.Generator().manual_seed(seed + 1)
    order = [SINK] + [t for t in torch.randperm(vocab, generator=gen).tolist() if t != SINK]
    nxt = [SINK] * vocab
    for i, t in enumerate(order[1:], start=1):
        nxt[t] = order[int(torch.randint(0, i, (1,), generator=gen))]
    nxt[FRIENDLY_MASK] = SINK
    return nxt


@torch.no_grad()
def write_friendly_target(
    folder: pathlib.Path,
    *,
    vocab: int = FRIENDLY_VOCAB,
    context: int = 4096,
    seed: int = 0,
    bigram: float = 0.8,
    layer_std: float = 0.16,
) -> pathlib.Path:
    """See the module docstring. `bigram` scales the bigram logits (the final hidden state of token t is
    about 8 * e_t, so the bigram logit is about 8 * bigram); `layer_std` scales the random layers that
    make the output depend on the context."""
    assert vocab <= HIDDEN
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(_target_config(vocab, context)).float().eval()
    gen = torch.Generator().manual_seed(seed)
    basis, _ = torch.linalg.qr(torch.randn(HIDDEN, HIDDEN, generator=gen))
    unit = basis[:vocab]  # orthonormal rows, one per token
    nxt = friendly_next_token(vocab, seed)
    head = torch.zeros(vocab, HIDDEN)
    for t in range(vocab):
        head[nxt[t]] += bigram * unit[t]
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.copy_(1.0 + 0.05 * torch.randn(p.shape, generator=gen))
        elif "embed_tokens" in name:
            p.copy_(unit * HIDDEN**0.5)
        elif name == "lm_head.weight":
            p.copy_(head + 0.02 * torch.randn(p.shape, generator=gen))
        else:
            p.copy_(layer_std * torch.randn(p.shape, generator=gen))
    return _save_target(model, folder)


def write_draft(
    folder: pathlib.Path,
    target: pathlib.Path,
    *,
    layers: int = 1,
    block_size: int = 4,
    target_layer_ids: tuple[int, ...] = (1, 2),
    mask_token_id: int | None = None,
    sliding_window: int = 64,
    layer_types: list[str] | None = None,
    seed: int = 1,
    std: float = 0.02,
    hidden_size: int | None = None,
    fc_in: int | None = None,
) -> pathlib.Path:
    """A DFLASH draft for `target` in the z-lab format, random weights (seeded; matrices N(0, std^2),
    norms 1 + small noise). mask_token_id defaults to the target's last token id. hidden_size and fc_in
    override the (correct) defaults to build broken drafts for the loader-error tests."""
    tcfg = json.loads((pathlib.Path(target) / "config.json").read_text())
    H = hidden_size or tcfg["hidden_size"]
    vocab = tcfg["vocab_size"]
    K = len(target_layer_ids)
    fc_in = fc_in or K * H
    mask = vocab - 1 if mask_token_id is None else mask_token_id
    types = layer_types or ["sliding_attention"] * layers
    cfg = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "torch_dtype": "float32",
        "dtype": "float32",
        "hidden_size": H,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": layers,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "max_position_embeddings": tcfg["max_position_embeddings"],
        "vocab_size": vocab,
        "tie_word_embeddings": False,
        "initializer_range": std,
        "use_cache": True,
        "layer_types": types,
        "sliding_window": sliding_window,
        "use_sliding_window": True,
        "block_size": block_size,
        "num_target_layers": tcfg["num_hidden_layers"],
        "dflash_config": {"block_size": block_size, "target_layer_ids": list(target_layer_ids), "mask_token_id": mask},
    }
    gen = torch.Generator().manual_seed(seed)
    mat = lambda *shape: std * torch.randn(*shape, generator=gen)  # noqa: E731
    norm = lambda n: 1.0 + 0.05 * torch.randn(n, generator=gen)  # noqa: E731
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    state = {"fc.weight": mat(H, fc_in), "hidden_norm.weight": norm(H), "norm.weight": norm(H)}
    for i in range(layers):
        p = f"layers.{i}."
        state.update(
            {
                p + "input_layernorm.weight": norm(H),
                p + "post_attention_layernorm.weight": norm(H),
                p + "self_attn.q_proj.weight": mat(q, H),
                p + "self_attn.k_proj.weight": mat(kv, H),
                p + "self_attn.v_proj.weight": mat(kv, H),
                p + "self_attn.o_proj.weight": mat(H, q),
                p + "self_attn.q_norm.weight": norm(HEAD_DIM),
                p + "self_attn.k_norm.weight": norm(HEAD_DIM),
                p + "mlp.gate_proj.weight": mat(INTERMEDIATE, H),
                p + "mlp.up_proj.weight": mat(INTERMEDIATE, H),
                p + "mlp.down_proj.weight": mat(H, INTERMEDIATE),
            }
        )
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file(
        {k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"), metadata={"format": "pt"}
    )
    return folder


def load_hf(target: pathlib.Path) -> Qwen3ForCausalLM:
    """The target as a Hugging Face model (fp32, CPU), for reference computations."""
    return Qwen3ForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
