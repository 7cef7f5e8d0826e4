"""The default model and its Hugging Face reference, shared by the end-to-end tests."""


import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from modeld.fetch_default import ensure_default_model

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
def hf_model(default_model):
    return AutoModelForCausalLM.from_pretrained(default_model, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def chat_ids(tokenizer):
    return [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                          tokenize=True, return_dict=False) for p in PROMPTS]


def greedy(hf_model, ids: list[int], max_new_tokens: int) -> list[int]:
    with torch.no_grad():
        out = hf_model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False,
                                attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    return out[0, len(ids):].tolist()


def greedy_without_eos(hf_model, ids: list[int], max_new_tokens: int) -> list[int]:
    """Argmax decoding that runs past EOS, with HF's own KV cache."""
    out, past, step = [], None, torch.tensor([ids])
    with torch.no_grad():
        for _ in range(max_new_tokens):
            result = hf_model(step, past_key_values=past, use_cache=True)
            past = result.past_key_values
            out.append(int(result.logits[0, -1].argmax()))
            step = torch.tensor([[out[-1]]])
    return out


@pytest.fixture(scope="session")
def hf_greedy(hf_model):
    """Greedy continuation by Hugging Face generate (memoised): new token ids, EOS included."""
    cache = {}

    def run(ids: list[int], max_new_tokens: int, ignore_eos: bool = False) -> list[int]:
        key = (tuple(ids), max_new_tokens, ignore_eos)
        if key not in cache:
            cache[key] = greedy_without_eos(hf_model, ids, max_new_tokens) if ignore_eos else greedy(hf_model, ids, max_new_tokens)
        return cache[key]

    return run
