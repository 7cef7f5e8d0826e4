"""Which grammar engine modeld constrains with: xgrammar and llguidance timed on the default model's tokenizer, on
the schemas of tests/modeld/grammar/schemas.py. Per schema: compile (grammar to matcher), then a walk along a
schema-valid answer: a bitmask per token and the token's consumption, and a rollback of 8 tokens (what a rejected
DFLASH block costs). Needs both engines: `pip install xgrammar llguidance` (modeld itself needs only the chosen one).

    python dev/grammar_engines.py
"""

import json
import statistics
import time

import llguidance
import llguidance.hf
import torch
import xgrammar
from transformers import AutoTokenizer

from modeld.model.fetch_default import ensure_default_model
from tests.modeld.grammar.schemas import SCHEMAS


def xgrammar_walk(tokenizer, vocab: int, schema: dict, answer: list[int]) -> tuple[float, float]:
    info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab)
    compiler = xgrammar.GrammarCompiler(info, cache_enabled=False)
    start = time.perf_counter()
    matcher = xgrammar.GrammarMatcher(compiler.compile_json_schema(json.dumps(schema)), max_rollback_tokens=16)
    compiled = time.perf_counter() - start
    bitmask = xgrammar.allocate_token_bitmask(1, vocab)
    start = time.perf_counter()
    for token in answer:
        matcher.fill_next_token_bitmask(bitmask)
        assert matcher.accept_token(token), token
    matcher.rollback(min(8, len(answer)))
    return compiled, (time.perf_counter() - start) / len(answer)


def llguidance_walk(tokenizer, vocab: int, schema: dict, answer: list[int]) -> tuple[float, float]:
    ll_tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab)
    start = time.perf_counter()
    matcher = llguidance.LLMatcher(ll_tokenizer, llguidance.LLMatcher.grammar_from_json_schema(schema))
    compiled = time.perf_counter() - start
    bitmask = torch.empty((1, (vocab + 31) // 32), dtype=torch.int32)
    start = time.perf_counter()
    for token in answer:
        matcher.unsafe_compute_mask_ptr(bitmask.data_ptr(), bitmask.numel() * 4)
        assert matcher.consume_token(token), (token, matcher.get_error())
    matcher.rollback(min(8, len(answer)))
    return compiled, (time.perf_counter() - start) / len(answer)


def main() -> None:
    folder = ensure_default_model()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    rows = {"xgrammar": ([], []), "llguidance": ([], [])}
    for name, (schema, instance) in SCHEMAS.items():
        answer = tokenizer.encode(json.dumps(instance), add_special_tokens=False)
        for engine, walk in (("xgrammar", xgrammar_walk), ("llguidance", llguidance_walk)):
            compiled, per_token = walk(tokenizer, vocab, schema, answer)
            rows[engine][0].append(compiled)
            rows[engine][1].append(per_token)
            print(
                f"{name:24s} {engine:10s} compile {compiled * 1e3:7.2f} ms  "
                f"mask+consume {per_token * 1e6:7.1f} us/token"
            )
    for engine, (compiles, per_tokens) in rows.items():
        print(
            f"{engine:10s} median compile {statistics.median(compiles) * 1e3:.2f} ms (max {max(compiles) * 1e3:.2f}), "
            f"median mask+consume {statistics.median(per_tokens) * 1e6:.1f} us/token (max {max(per_tokens) * 1e6:.1f})"
        )


if __name__ == "__main__":
    main()
