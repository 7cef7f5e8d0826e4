"""The engine's tuning knobs: how it runs a step, never what it computes (every value gives the same tokens). Their
defaults are the fastest measured for modeld as served (BENCHMARKS.md, "Where things stand"); they are not user
flags. The environment variable MODELD_TUNING ("field=value,field=value") overrides them for one run: benchmarks
ablate a knob that way (bench's --ablate), and an operator may try one without a rebuild."""

import os
from dataclasses import dataclass, fields, replace
from typing import get_args

ENVIRONMENT_VARIABLE = "MODELD_TUNING"
# Graphs of one request's prompt chunk (bucket 1), padded up to the smallest that holds it; longer chunks run eagerly
# (modeld.runner.graphs)
PROMPT_TOKENS = (16, 32, 64, 128)


@dataclass(frozen=True)
class Tuning:
    # projections of <= 16 rows through the skinny Triton kernel, one launch that streams each weight once (False:
    # cuBLAS)
    skinny_linear: bool = True
    # with the skinny kernel: the residual add + RMSNorm before q|k|v and gate|up, the SiLU-mul after gate|up and
    # the rotary + K/V write after q|k|v inside the projection (False: kernels of their own)
    norm_fusion: bool = True
    # decode steps (greedy DFLASH: verify steps) one engine step runs back to back before their tokens reach the
    # host: one graph replay for greedy batches, a chain of one-step replays otherwise
    steps_per_replay: int = 4
    # a plain decode step of an unchanged batch queued on the device before the last one is committed
    # (modeld.runner.steps_ahead); None: on CUDA only (on the CPU the queued step would run before the last streams)
    overlap_decode: bool | None = None
    # with CUDA graphs, a lone prompt chunk of at most this many tokens runs in a step of its own while requests
    # decode (a graph of one request instead of an eager step of the batch); 0: off; None: max(PROMPT_TOKENS) with
    # CUDA graphs, else off
    alone_prompt_tokens: int | None = None
    # DFLASH verifies a step's decodes only where modeld.spec.policy expects that to commit more tokens a second
    # than plain decoding, from the live acceptance and the measured step costs (False: at every step, below the
    # user's hard cap --speculative-disable-by-batch-size)
    adaptive_speculation: bool = True
    # the smallest batch that runs several decode steps a replay: they paid at 16 and 64 running, not at batch 1,
    # where short answers end inside a replay (docs/benchmarks-history.md, "several steps from 16 requests")
    several_steps_from_batch: int = 16
    # the same for greedy verify steps: a verify step's host work is not overlapped with the device's (a plain
    # decode's is), so paying it once per replay pays from batch 1 (docs/benchmarks-history.md, "Several greedy
    # verify steps a replay from batch 1")
    several_cycles_from_batch: int = 1

    def __post_init__(self):
        checks = (
            (self.steps_per_replay >= 1, "steps_per_replay must be >= 1"),
            (
                self.alone_prompt_tokens is None or 0 <= self.alone_prompt_tokens <= max(PROMPT_TOKENS),
                f"alone_prompt_tokens must lie in [0, {max(PROMPT_TOKENS)}] (the largest prompt graph)",
            ),
            (self.several_steps_from_batch >= 1, "several_steps_from_batch must be >= 1"),
            (self.several_cycles_from_batch >= 1, "several_cycles_from_batch must be >= 1"),
        )
        for ok, message in checks:
            if not ok:
                raise ValueError(f"{ENVIRONMENT_VARIABLE}: {message}")

    def overlaps_decode(self, device: str) -> bool:
        return device == "cuda" if self.overlap_decode is None else self.overlap_decode

    def alone_prompt_limit(self, graphed: bool) -> int:
        """The longest lone prompt chunk that runs without the decodes (0: none): it needs CUDA graphs."""
        if not graphed:
            return 0
        return max(PROMPT_TOKENS) if self.alone_prompt_tokens is None else self.alone_prompt_tokens

    def overridden(self, spec: str) -> "Tuning":
        """These values with "field=value,field=value" applied (values as Python writes them: 4, True, None)."""
        known = {f.name: f for f in fields(self)}
        changes = {}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            name, sep, text = part.partition("=")
            name = name.strip()
            if not sep or name not in known:
                raise ValueError(
                    f"{ENVIRONMENT_VARIABLE}: {part!r} is not field=value with a field of {', '.join(known)}"
                )
            value = parse_value(name, text.strip())
            kind = known[name].type
            takes_bool = kind is bool or bool in get_args(kind)
            if not isinstance(value, kind) or (isinstance(value, bool) and not takes_bool):
                raise ValueError(f"{ENVIRONMENT_VARIABLE}: {name} takes {kind}, got {text!r}")
            changes[name] = value
        return replace(self, **changes)


def parse_value(name: str, text: str) -> bool | int | None:
    lowered = text.lower()
    if lowered == "none":
        return None
    if lowered in ("true", "false"):
        return lowered == "true"
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{ENVIRONMENT_VARIABLE}: {name}={text!r} is not a number, true, false or none") from None


def tuning_from_environment() -> Tuning:
    return Tuning().overridden(os.environ.get(ENVIRONMENT_VARIABLE, ""))
