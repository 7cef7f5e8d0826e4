"""Target loading: a GGUF file through transformers, random weights from config.json alone
(--load-format dummy), and clear errors for folders that cannot be loaded."""

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3Config

from modeld.model.fetch_default import ensure_default_gguf
from modeld.model.loader import load_target
from tests.modeld.runner.paged import PagedPools


def our_logits(model, cfg, ids: list[int]) -> torch.Tensor:
    pools = PagedPools(cfg, pages=64, page_size=1)
    hidden, _ = model(pools.batch([(1, ids)]), pools.kv)
    return model.logits(hidden)


def test_gguf_loads_through_transformers():
    gguf = ensure_default_gguf()
    ours, tokenizer, cfg = load_target(str(gguf), "float32", "cpu")
    hf = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    ids = tokenizer("The quick brown fox")["input_ids"]
    with torch.no_grad():
        expected = hf(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(our_logits(ours, cfg, ids), expected, atol=2e-4, rtol=1e-4)
    assert tokenizer.chat_template


def test_dummy_weights_from_config_alone(tmp_path):
    Qwen3Config(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=128,
    ).save_pretrained(tmp_path)
    model, tokenizer, cfg = load_target(str(tmp_path), "float32", "cpu", load_format="dummy")
    assert tokenizer is None
    logits = our_logits(model, cfg, [1, 2, 3, 4])
    assert logits.shape == (4, 97) and torch.isfinite(logits).all() and logits.std() > 0
    again, _, _ = load_target(str(tmp_path), "float32", "cpu", load_format="dummy")
    torch.testing.assert_close(our_logits(again, cfg, [1, 2, 3, 4]), logits)  # seeded: reproducible


def test_folder_without_weights_is_a_clear_error(tmp_path):
    Qwen3Config(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
    ).save_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="load-format dummy"):
        load_target(str(tmp_path), "float32", "cpu")


def test_unsupported_family_is_refused(tmp_path):
    from transformers import GPT2Config

    GPT2Config(n_layer=1, n_embd=32, n_head=4).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="unsupported model_type 'gpt2'"):
        load_target(str(tmp_path), "float32", "cpu", load_format="dummy")
