"""Process-wide test set-up.

Without a GPU, Triton kernels run only through Triton's interpreter, and TRITON_INTERPRET must be
set before any kernel is defined (when modeld.kernels is first imported), so it is set here,
before any test module is imported. On a GPU machine it stays unset: kernels run compiled.
"""

import inspect
import os

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from modeld.model.fetch_default import ensure_default_model

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "gpu: needs a CUDA GPU: skipped without one (on a GPU machine, -m gpu runs them)"
    )


def pytest_collection_modifyitems(config, items):
    """Tests marked gpu skip cleanly on a machine without CUDA."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# The default model and its Hugging Face reference, shared by the end-to-end tests.

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers.",
    "Explain recursion to a child in two sentences.",
    "def fibonacci(n):",
    "Translate 'good morning' into Spanish.",
    "Why is the sky blue?",
    "Name a famous painting.",
]


@pytest.fixture(scope="session")
def default_model():
    return ensure_default_model()


@pytest.fixture(scope="session")
def tokenizer(default_model):
    return AutoTokenizer.from_pretrained(default_model)


@pytest.fixture(scope="session")
def hf_models(default_model):
    """The HF reference per device: fp32 on the CPU, bf16 on CUDA (as the daemons run)."""
    models = {}

    def get(device: str):
        if device not in models:
            dtype = torch.float32 if device == "cpu" else torch.bfloat16
            models[device] = AutoModelForCausalLM.from_pretrained(default_model, dtype=dtype).to(device).eval()
        return models[device]

    return get


@pytest.fixture(scope="session")
def hf_model(hf_models):
    return hf_models("cpu")


@pytest.fixture(scope="session")
def chat_ids(tokenizer):
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for p in PROMPTS
    ]


def greedy(hf_model, ids: list[int], max_new_tokens: int) -> list[int]:
    with torch.no_grad():
        out = hf_model.generate(
            torch.tensor([ids], device=hf_model.device),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            attention_mask=torch.ones(1, len(ids), dtype=torch.long, device=hf_model.device),
        )
    return out[0, len(ids) :].tolist()


def greedy_without_eos(hf_model, ids: list[int], max_new_tokens: int) -> list[int]:
    """Argmax decoding that runs past EOS, with HF's own KV cache. Newer transformers name the cache argument (and
    output) `cache` and drop `past_key_values` in 5.40; older ones (the GPU machine's) know only `past_key_values`."""
    cache_name = "cache" if "cache" in inspect.signature(hf_model.forward).parameters else "past_key_values"
    out, past, step = [], None, torch.tensor([ids], device=hf_model.device)
    with torch.no_grad():
        for _ in range(max_new_tokens):
            result = hf_model(step, use_cache=True, **{cache_name: past})
            past = getattr(result, cache_name)
            out.append(int(result.logits[0, -1].argmax()))
            step = torch.tensor([[out[-1]]], device=hf_model.device)
    return out


@pytest.fixture(scope="session")
def hf_greedy(hf_models):
    """Greedy continuation by Hugging Face (memoised): new token ids, EOS included."""
    cache = {}

    def run(ids: list[int], max_new_tokens: int, ignore_eos: bool = False, device: str = "cpu") -> list[int]:
        key = (tuple(ids), max_new_tokens, ignore_eos, device)
        if key not in cache:
            model = hf_models(device)
            cache[key] = (
                greedy_without_eos(model, ids, max_new_tokens) if ignore_eos else greedy(model, ids, max_new_tokens)
            )
        return cache[key]

    return run


# bf16 on the GPU: two correct implementations can part where the two best logits are nearly equal.
# 0.25 is two bf16 steps at the logits' magnitude here (8..32): a smaller gap is within rounding.
NEAR_TIE = 0.25


@pytest.fixture(scope="session")
def assert_greedy_equal(hf_models, hf_greedy):
    """Exact equality on the CPU (fp32). On CUDA (bf16) a difference is accepted only if, at the
    first differing position, HF's two best logits are within NEAR_TIE."""

    def check(ours: list[int], ids: list[int], max_new_tokens: int, device: str, ignore_eos: bool = False) -> None:
        expected = hf_greedy(ids, max_new_tokens, ignore_eos, device)
        if ours == expected or device == "cpu":
            assert ours == expected
            return
        first = next((i for i, (a, b) in enumerate(zip(ours, expected)) if a != b), min(len(ours), len(expected)))
        model = hf_models(device)
        with torch.no_grad():
            logits = model(torch.tensor([ids + expected[:first]], device=model.device)).logits[0, -1].float()
        top2 = logits.topk(2).values
        gap = float(top2[0] - top2[1])
        assert gap <= NEAR_TIE, f"outputs part at token {first} where HF's top-2 logit gap is {gap:.3f} > {NEAR_TIE}"

    return check
