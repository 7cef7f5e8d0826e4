"""The requests an in-process engine benchmark sends: chat prompts in the target's template (random ids with dummy
weights), submitted greedy or sampled, and read back as modeld's gRPC handlers read them."""

import time

import torch

from modeld.detokenize import TextStream
from modeld.engine.loop import make_generator
from modeld.request import Request
from modeld.sampling_params import SamplingParams

SAMPLED_TEMPERATURE, SAMPLED_TOP_P = 0.8, 0.95  # the requests that sample (DFLASH's split path, not the greedy cycle)
CHAT = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers.",
    "Explain recursion to a child in two sentences.",
    "Why is the sky blue?",
    "Name a famous painting and its painter.",
    "Give me a recipe for pancakes.",
    "How do vaccines work?",
    "Write a short story about a robot learning to paint.",
    "What are the benefits of exercise?",
    "Describe the water cycle.",
    "Explain what a black hole is.",
    "Suggest three names for a bakery.",
    "How do I reverse a list in Python?",
    "What causes seasons on Earth?",
    "Summarise the plot of Romeo and Juliet.",
]


def prompts_for(target: str, load_format: str, count: int) -> list[list[int]]:
    """`count` chat prompts in the target's template; with dummy weights, random ids of its vocabulary (seeded)."""
    from transformers import AutoConfig, AutoTokenizer

    if load_format == "dummy":
        gen = torch.Generator().manual_seed(0)
        vocab = AutoConfig.from_pretrained(target).vocab_size
        return [torch.randint(100, vocab, (24,), generator=gen).tolist() for _ in range(count)]
    tokenizer = AutoTokenizer.from_pretrained(target)
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": CHAT[i % len(CHAT)]}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        for i in range(count)
    ]


def submit_requests(
    engine, prompts: list[list[int]], new_tokens: int, ignore_eos: bool, tag: str, temperature: float = 0.0
) -> list[Request]:
    """One request per prompt, submitted to the engine: greedy, or sampled at `temperature` (top-p SAMPLED_TOP_P,
    seeded per request, so every configuration samples the same way)."""
    reqs = []
    for i, p in enumerate(prompts):
        params = SamplingParams(
            max_new_tokens=new_tokens,
            temperature=temperature,
            ignore_eos=ignore_eos,
            top_p=SAMPLED_TOP_P if temperature else 1.0,
            seed=i if temperature else None,
        )
        generator = None if params.greedy else make_generator(params.seed, engine.runner.device)  # as modeld's service
        reqs.append(Request(rid=f"{tag}-{i}", prompt_ids=list(p), params=params, generator=generator))
    for r in reqs:
        assert engine.submit(r)
    return reqs


def generate_all(
    engine,
    prompts: list[list[int]],
    new_tokens: int,
    ignore_eos: bool,
    tag: str,
    temperature: float = 0.0,
    first_tokens: list[tuple[float, int]] | None = None,
) -> tuple[int, float, int]:
    """Submits every prompt at once; (generated tokens, seconds, verify steps) when all completed. This thread makes
    each request's text from its streamed ids, as a gRPC handler does (modeld.front.service), beside the engine's
    thread. With `first_tokens`, each request's first streamed tokens go there: (seconds from the submission, how
    many)."""
    begin = time.perf_counter()
    reqs = submit_requests(engine, prompts, new_tokens, ignore_eos, tag, temperature)
    for r in reqs:
        text = TextStream(engine.output.tokenizer, [])
        while True:
            kind, *payload = r.events.get(timeout=600)
            if kind == "complete":
                break
            if first_tokens is not None and not text.ids and payload[0]:
                first_tokens.append((time.perf_counter() - begin, len(payload[0])))
            text.add(payload[0], payload[2])
    seconds = time.perf_counter() - begin
    failed = [r.finish for r in reqs if r.finish.reason == "abort"]
    assert not failed, failed
    return sum(len(r.output_ids) for r in reqs), seconds, sum(r.spec_verify_ct for r in reqs)
