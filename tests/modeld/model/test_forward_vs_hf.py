"""Our paged forward against the Hugging Face forward of the same weights, in fp32 on the CPU:
small random Qwen3, Qwen2 and Llama configs, and SmolLM2-135M-Instruct (the default model).

Tolerance: logits agree within atol 2e-4 + rtol 1e-4 (fp32; the only differences are summation
order in attention and matmul blocking). Checked for prefill (in chunks, so the second chunk
reads a cached prefix), each decode step, a multi-token verify forward, and a mixed batch.
"""

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

from modeld.model.fetch_default import ensure_default_model
from modeld.model.loader import load_target
from tests.modeld.runner.paged import PagedPools

ATOL, RTOL = 2e-4, 1e-4


def tiny_config(family: str):
    common = dict(
        vocab_size=311,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    )
    if family == "qwen3":
        return Qwen3Config(head_dim=16, rope_theta=10000.0, **common)
    if family == "qwen2":
        return Qwen2Config(rope_theta=10000.0, **common)
    return LlamaConfig(rope_theta=500000.0, **{**common, "hidden_size": 96, "tie_word_embeddings": True})


@pytest.fixture(scope="module", params=["qwen3", "qwen2", "llama", "smollm2"])
def tiny_pair(request, tmp_path_factory):
    if request.param == "smollm2":  # the default model, converted once into the cache
        folder = ensure_default_model()
        hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        ours, _, cfg = load_target(str(folder), "float32", "cpu")
        return hf, ours, cfg
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(tiny_config(request.param)).float().eval()
    folder = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(folder)
    ours, _, cfg = load_target(str(folder), "float32", "cpu")
    return hf, ours, cfg


def hf_logits(hf, ids: list[int], device: str = "cpu") -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids], device=device)).logits[0].float()


@pytest.mark.parametrize("page_size", [1, 64])
def test_prefill_decode_verify_match_hf(tiny_pair, page_size):
    hf, ours, cfg = tiny_pair
    pools = PagedPools(cfg, pages=64 if page_size == 1 else 8, page_size=page_size)
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, cfg.vocab_size, (37,), generator=gen).tolist()
    ids = list(prompt)
    # Prefill in two chunks: the second extends over a cached prefix of 20 tokens.
    for start, end in ((0, 20), (20, len(prompt))):
        hidden, _ = ours(pools.batch([(1, prompt[start:end])]), pools.kv)
        torch.testing.assert_close(ours.logits(hidden), hf_logits(hf, prompt)[start:end], atol=ATOL, rtol=RTOL)
    for _ in range(5):  # decode
        nxt = int(hf_logits(hf, ids)[-1].argmax())
        ids.append(nxt)
        hidden, _ = ours(pools.batch([(1, [nxt])]), pools.kv)
        torch.testing.assert_close(ours.logits(hidden)[-1], hf_logits(hf, ids)[-1], atol=ATOL, rtol=RTOL)
    block = torch.randint(0, cfg.vocab_size, (4,), generator=gen).tolist()  # a verify block
    hidden, _ = ours(pools.batch([(1, block)]), pools.kv)
    torch.testing.assert_close(ours.logits(hidden), hf_logits(hf, ids + block)[-4:], atol=ATOL, rtol=RTOL)


def test_mixed_batch_matches_hf(tiny_pair):
    """A prefill, a decode and a verify block of three requests in one forward."""
    hf, ours, cfg = tiny_pair
    pools = PagedPools(cfg, pages=128, page_size=1)
    gen = torch.Generator().manual_seed(2)
    a, b, c = (torch.randint(0, cfg.vocab_size, (n,), generator=gen).tolist() for n in (9, 14, 6))
    ours(pools.batch([(2, b[:-1]), (3, c[:-3])]), pools.kv)  # earlier steps
    hidden, _ = ours(pools.batch([(1, a), (2, b[-1:]), (3, c[-3:])]), pools.kv)
    logits = ours.logits(hidden)
    torch.testing.assert_close(logits[:9], hf_logits(hf, a), atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(logits[9], hf_logits(hf, b)[-1], atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(logits[10:], hf_logits(hf, c)[-3:], atol=ATOL, rtol=RTOL)


@pytest.mark.gpu
def test_smollm2_bf16_on_gpu_matches_hf():
    """bf16 on CUDA (Triton kernels). The yardstick is HF's own bf16 error: against HF in fp32 on the
    same weights, our bf16 logits may be off by at most twice what HF's bf16 forward is off, plus
    one bf16 step at the logits' magnitude (0.125), at every prefill position and decode step."""
    folder = ensure_default_model()
    hf16 = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).cuda().eval()
    hf32 = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).cuda().eval()
    ours, _, cfg = load_target(str(folder), "bfloat16", "cuda")
    pools = PagedPools(cfg, pages=8, page_size=64, dtype=torch.bfloat16)
    pools.kv, pools.req_to_token = pools.kv.cuda(), pools.req_to_token.cuda()
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, cfg.vocab_size, (41,), generator=gen).tolist()
    hidden, _ = ours(to_cuda(pools.batch([(1, ids)])), pools.kv)
    steps = [(ours.logits(hidden), hf_logits(hf16, ids, "cuda"), hf_logits(hf32, ids, "cuda"))]
    for _ in range(8):
        ids.append(int(steps[-1][2][-1].argmax()))
        hidden, _ = ours(to_cuda(pools.batch([(1, ids[-1:])])), pools.kv)
        steps.append((ours.logits(hidden)[-1:], hf_logits(hf16, ids, "cuda")[-1:], hf_logits(hf32, ids, "cuda")[-1:]))
    ours_err = max(float((o - ref).abs().max()) for o, _, ref in steps)
    hf_err = max(float((h - ref).abs().max()) for _, h, ref in steps)
    print(f"bf16 vs fp32 max |logit error|: ours {ours_err:.4f}, HF {hf_err:.4f}")
    assert ours_err <= 2 * hf_err + 0.125


def to_cuda(batch):
    for name, value in vars(batch).items():
        if value is not None:
            setattr(batch, name, value.cuda())
    return batch
