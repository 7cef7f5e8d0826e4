"""Compiling a request's constraint into a grammar (xgrammar), off the engine thread, once per distinct constraint.

xgrammar over llguidance: on the default model's tokenizer its mask costs about a fifth of llguidance's per token
(its token-mask cache is built at compile time), and under DFLASH the mask is computed at every position of a
verified block; llguidance compiles faster, which its cache makes rare (BENCHMARKS.md, dev/grammar_engines.py).

JSON comes out compact (no free whitespace: a model cannot spend its tokens on blanks), and a schema's objects take
no properties it does not name unless it allows them (xgrammar's strict mode: every output still satisfies the
schema). Compilation runs on one thread of its own: the engine thread only collects finished compilations, so a
large schema delays its own request, never a step of the others."""

import re
from concurrent.futures import Future, ThreadPoolExecutor

from modeld.sampling_params import Constraint, InvalidRequest

CACHE_BYTES = 256 << 20  # compiled grammars kept for reuse (least recently used dropped first)
COMPILE_THREADS = 1


class GrammarCompiler:
    def __init__(self, tokenizer, vocab_size: int, stop_ids: set[int]):
        """vocab_size: the LM head's rows (may exceed the tokenizer's: the extra ids are never allowed). The
        tokenizer's tables are made at the first constraint, on the compile thread (a modeld that is never asked for
        one never pays for them)."""
        self.tokenizer, self.vocab_size, self.stop_ids = tokenizer, vocab_size, sorted(stop_ids)
        self.compiler = None  # xgrammar's GrammarCompiler, made (and xgrammar imported) by the compile thread
        self.pool = ThreadPoolExecutor(COMPILE_THREADS, thread_name_prefix="modeld-grammar")

    def submit(self, constraint: Constraint) -> Future:
        """The compiled grammar, later: the future's result, or InvalidRequest saying what is wrong."""
        return self.pool.submit(self.compile, constraint)

    def compile(self, constraint: Constraint):
        """The constraint's xgrammar CompiledGrammar; InvalidRequest saying what is wrong with it."""
        import xgrammar  # imported with the first constraint: a modeld that serves none never loads it

        if self.compiler is None:
            info = xgrammar.TokenizerInfo.from_huggingface(
                self.tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.stop_ids
            )
            self.compiler = xgrammar.GrammarCompiler(
                info, max_threads=COMPILE_THREADS, cache_enabled=True, cache_limit_bytes=CACHE_BYTES
            )
        try:
            if constraint.kind == "regex":
                return self.compiler.compile_regex(constraint.text)
            if constraint.kind == "json_object":
                return self.compiler.compile_json_schema('{"type": "object"}', any_whitespace=False, strict_mode=False)
            return self.compiler.compile_json_schema(constraint.text, any_whitespace=False, strict_mode=True)
        except (RuntimeError, ValueError, TypeError) as exc:  # xgrammar's errors of a bad schema or regex
            raise InvalidRequest(f"the {constraint.kind} constraint does not compile: {first_line(exc)}") from None


LOG_PREFIX = re.compile(r"^\[[0-9:]+\] \S+:[0-9]+: ")  # xgrammar's "[time] file.cc:line: " before its message


def first_line(exc: Exception) -> str:
    """The engine's message without its log prefix, one line, bounded."""
    lines = str(exc).strip().splitlines()
    return LOG_PREFIX.sub("", lines[0])[:300] if lines else type(exc).__name__
