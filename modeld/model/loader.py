"""Load a target: a Hugging Face folder (config.json + safetensors + tokenizer), a GGUF file
(through transformers), or random weights built from config.json alone (--load-format dummy); and its EOS ids."""

import os
import pathlib

import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from modeld.model.causal_lm import CausalLM, fuse_checkpoint
from modeld.model.tensor_parallel import shard_config, shard_state

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def _from_gguf(path: pathlib.Path):
    """transformers dequantises the GGUF; we keep its config and state dict."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    hf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    cfg = hf.config
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    return cfg, tokenizer, hf.state_dict()


def safetensors_state(folder: pathlib.Path) -> dict:
    """Every tensor of the folder's *.safetensors files."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {folder}")
    state = {}
    for f in files:
        state.update(load_file(str(f)))
    return state


def load_target(path: str, dtype: str, device: str, load_format: str = "auto", tensor_parallel=None):
    """Returns (model, tokenizer or None, hf config). With `tensor_parallel` (modeld.model.tensor_parallel's), the
    model is that rank's share of the target (its config the rank's heads and width; the returned config the whole
    model's); dummy weights are then the whole model's seeded draw, split."""
    location = pathlib.Path(path)
    state = None
    tokenizer = None
    if location.suffix == ".gguf":
        cfg, tokenizer, state = _from_gguf(location)
    else:
        cfg = AutoConfig.from_pretrained(location)
        if (location / "tokenizer.json").exists() or (location / "tokenizer_config.json").exists():
            tokenizer = AutoTokenizer.from_pretrained(location)
        if load_format != "dummy":
            try:
                state = safetensors_state(location)
            except FileNotFoundError as exc:
                raise FileNotFoundError(f"{exc} (use --load-format dummy for random weights)") from None
    torch_dtype = DTYPES[dtype]
    with torch.device(device):
        model = CausalLM(cfg).to(torch_dtype)
    if state is None:
        _random_init(model, cfg)
    else:
        _load_state(model, state, cfg)
    if tensor_parallel is not None:
        model = _rank_share(model, cfg, tensor_parallel, torch_dtype, device)
    return model.eval(), tokenizer, cfg


def _rank_share(whole: CausalLM, cfg, tensor_parallel, torch_dtype, device) -> CausalLM:
    """The rank's CausalLM, its weights split from the whole model's."""
    state = shard_state(whole.state_dict(), cfg, tensor_parallel)
    with torch.device(device):
        model = CausalLM(shard_config(cfg, tensor_parallel.size)).to(torch_dtype)
    model.load_state_dict(state)
    for layer in model.model.layers:
        layer.tensor_parallel = tensor_parallel
    return model


def as_ids(eos) -> set[int]:
    """A config's eos_token_id (one id, a list of them, or None) as a set."""
    return set(eos if isinstance(eos, list) else [eos] if eos is not None else [])


def eos_token_ids(tokenizer, hf_config, model_dir: str) -> set[int]:
    """EOS ids from the generation config, the model config and the tokenizer."""
    ids: set[int] = set()
    try:
        gen = GenerationConfig.from_pretrained(model_dir)
        ids |= as_ids(gen.eos_token_id)
    except (OSError, ValueError):
        pass
    ids |= as_ids(getattr(hf_config, "eos_token_id", None))
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


def _load_state(model: CausalLM, state: dict, cfg) -> None:
    tied = bool(getattr(cfg, "tie_word_embeddings", False))
    if tied:
        state.pop("lm_head.weight", None)
    missing, unexpected = model.load_state_dict(fuse_checkpoint(state, cfg.num_hidden_layers), strict=False)
    missing = [k for k in missing if not (tied and k == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"checkpoint does not fit the model: missing {missing[:8]}, unexpected {unexpected[:8]}")


@torch.no_grad()
def _random_init(model: CausalLM, cfg) -> None:
    """Seeded random weights, drawn on the model's device (an 8B model's in seconds on a GPU)."""
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(0)
    std = getattr(cfg, "initializer_range", 0.02)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.fill_(1.0)
        else:
            p.copy_(torch.randn(p.shape, generator=gen, device=device) * std)
