"""Tiny Hugging Face style config folders for tests (memd reads config.json only)."""

import json
import pathlib


def write_config(folder: pathlib.Path, cfg: dict) -> pathlib.Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def tiny_target(
    folder: pathlib.Path, *, layers=2, kv_heads=2, head_dim=16, dtype="float32", context=1024, **extra
) -> pathlib.Path:
    return write_config(
        folder,
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "num_hidden_layers": layers,
            "num_attention_heads": kv_heads * 2,
            "num_key_value_heads": kv_heads,
            "hidden_size": kv_heads * 2 * head_dim,
            "head_dim": head_dim,
            "torch_dtype": dtype,
            "max_position_embeddings": context,
            **extra,
        },
    )


def tiny_draft(
    folder: pathlib.Path, *, layers=1, kv_heads=2, head_dim=16, window=64, block=4, layer_types=None, **extra
) -> pathlib.Path:
    return write_config(
        folder,
        {
            "architectures": ["DFlashDraftModel"],
            "model_type": "qwen3",
            "num_hidden_layers": layers,
            "num_attention_heads": kv_heads * 2,
            "num_key_value_heads": kv_heads,
            "hidden_size": kv_heads * 2 * head_dim,
            "head_dim": head_dim,
            "layer_types": layer_types or ["sliding_attention"] * layers,
            "sliding_window": window,
            "dflash_config": {"block_size": block, "target_layer_ids": [0], "mask_token_id": 0},
            **extra,
        },
    )
