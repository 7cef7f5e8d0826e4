"""The modeld configurations an engine benchmark compares, one row each: plain or DFLASH as served (modeld's defaults
on CUDA), and each --ablate: the as-served configuration with some of its settings changed.

    --rows plain,dflash                     the as-served rows (default: both, plain alone with --draft none)
    --ablate [plain:|dflash:]KEY=VALUE,...  one more row for each kind of --rows, or for the kind named
                                            (repeatable; DFLASH's row alone when a KEY is one only DFLASH reads)

A KEY is a field of modeld's Tuning (modeld/engine/tuning.py; values as MODELD_TUNING takes them: 4, true, none) or
one of modeld's own flags, spelled as its ModeldConfig field: disable_cuda_graph, speculative_disable_by_batch_size.
"""

import argparse
import os
from dataclasses import dataclass, fields

import torch

from memd import defaults
from modeld.config import ModeldConfig
from modeld.engine.tuning import ENVIRONMENT_VARIABLE, Tuning, parse_value

KINDS = ("plain", "dflash")
KIND_NAMES = {"plain": "plain", "dflash": "DFLASH"}
TUNING_KEYS = tuple(f.name for f in fields(Tuning))
FLAG_KEYS = {"disable_cuda_graph": bool, "speculative_disable_by_batch_size": int}  # modeld's flags, by their type
# keys that change nothing without a draft: an ablation of them on a plain row would repeat plain as served
DFLASH_ONLY = {"speculative_disable_by_batch_size", "adaptive_speculation", "several_cycles_from_batch"}


@dataclass(frozen=True)
class Ablation:
    spec: str  # the changes as written, without the kind: the row's name
    kind: str | None  # the only kind it changes (None: every kind of --rows)
    tuning: Tuning
    flags: tuple[tuple[str, bool | int], ...]  # (ModeldConfig field, value) of modeld's flags
    dflash_only: bool  # a key only DFLASH reads: without a kind, it changes the DFLASH rows alone


@dataclass(frozen=True)
class Row:
    kind: str  # "plain" or "dflash"
    ablation: Ablation | None = None  # None: as served
    simulated_accept: float | None = None  # DFLASH verifying by a drawn acceptance of this mean (None: the draft's)

    @property
    def name(self) -> str:
        served = f"{KIND_NAMES[self.kind]} as served"
        name = served if self.ablation is None else f"{served}, {self.ablation.spec}"
        return name if self.simulated_accept is None else f"{name}, simulated accept {self.simulated_accept:g}"


def parse_ablation(text: str) -> Ablation:
    """An --ablate value, "[KIND:]KEY=VALUE,..."; ValueError naming the part that is wrong."""
    kind, colon, spec = text.partition(":")
    if not colon:
        kind, spec = None, text
    elif kind not in KINDS:
        raise ValueError(f"{text!r}: the kind before ':' must be one of {', '.join(KINDS)}")
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    if not parts:
        raise ValueError(f"{text!r} changes nothing: give KEY=VALUE")
    tuning_parts, flags = [], []
    for part in parts:
        key, equals, value = (s.strip() for s in part.partition("="))
        if not equals or key not in (*TUNING_KEYS, *FLAG_KEYS):
            raise ValueError(
                f"{part!r} is not KEY=VALUE with a KEY of modeld's Tuning ({', '.join(TUNING_KEYS)}) "
                f"or of its flags ({', '.join(FLAG_KEYS)})"
            )
        if kind == "plain" and key in DFLASH_ONLY:
            raise ValueError(f"{key} changes DFLASH rows only: write dflash:{spec}")
        if key in FLAG_KEYS:
            parsed = parse_value(key, value)
            if type(parsed) is not FLAG_KEYS[key]:
                raise ValueError(f"{key} takes {FLAG_KEYS[key].__name__}, got {value!r}")
            flags.append((key, parsed))
        else:
            tuning_parts.append(f"{key}={value}")
    return Ablation(
        spec=",".join(parts),
        kind=kind,
        tuning=Tuning().overridden(",".join(tuning_parts)),
        flags=tuple(flags),
        dflash_only=any(p.partition("=")[0].strip() in DFLASH_ONLY for p in parts),
    )


def argument_ablation(text: str) -> Ablation:
    """parse_ablation for argparse: its message becomes the usage error (Tuning's messages name MODELD_TUNING, the
    way an operator sets them; here they come from --ablate)."""
    try:
        return parse_ablation(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix(f"{ENVIRONMENT_VARIABLE}: ")) from None


def rows_for(kinds: list[str], ablations: list[Ablation]) -> list[Row]:
    """Each kind's as-served row (if `kinds` has it), then its ablations in the order given; plain before DFLASH.
    An ablation with a kind changes that kind's row; without one, the row of each of `kinds` (DFLASH's alone for a
    DFLASH-only key)."""
    rows = []
    for kind in KINDS:
        mine = [
            a
            for a in ablations
            if a.kind == kind or (a.kind is None and kind in kinds and (kind == "dflash" or not a.dflash_only))
        ]
        rows += ([Row(kind)] if kind in kinds else []) + [Row(kind, a) for a in mine]
    return rows


def row_config(
    row: Row, memd: str, target: str, load_format: str, draft: str | None, device: str = "cuda"
) -> ModeldConfig:
    """modeld's settings for a row: its defaults, then the row's ablation."""
    dflash = row.kind == "dflash"
    ablation = row.ablation
    return ModeldConfig(
        device=device,
        memd=memd,
        target_model=target,
        load_format=load_format,
        draft_model=draft if dflash else None,
        speculative_algorithm="dflash" if dflash else "none",
        tuning=Tuning() if ablation is None else ablation.tuning,
        **dict(() if ablation is None else ablation.flags),
    )


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """--target, --load-format, --draft and --device, as the engine benchmarks take them."""
    p.add_argument("--target", help="HF folder (default: the project's SmolLM2-135M-Instruct)")
    p.add_argument("--load-format", choices=["auto", "dummy"], default="auto")
    p.add_argument("--draft", default=str(defaults.default_draft_dir()), help="z-lab format draft, or 'none'")
    p.add_argument(
        "--device", choices=["cuda", "cpu"], default="cuda", help="modeld's and memd's device (cpu: no CUDA graphs)"
    )


def device_name(device: str) -> str:
    """The card (or CPU) a benchmark ran on, for its report."""
    if device == "cuda":
        return torch.cuda.get_device_name()
    return f"CPU ({os.cpu_count()} cores, {torch.get_num_threads()} torch threads)"


def add_row_arguments(p: argparse.ArgumentParser, default_ablations: tuple[str, ...] = ()) -> None:
    """--rows and --ablate (read back by rows_from_args)."""
    p.add_argument(
        "--rows",
        help="comma-separated as-served rows: plain (modeld without a draft), dflash (with --draft); "
        "default: both, or plain with --draft none",
    )
    shown = " ".join(f"--ablate {a}" for a in default_ablations) or "none"
    p.add_argument(
        "--ablate",
        action="append",
        type=argument_ablation,
        metavar="[KIND:]KEY=VALUE,...",
        help="one more row (repeatable): the as-served configuration with these changes, for each kind of --rows "
        "(DFLASH's alone if a KEY is one only DFLASH reads: "
        f"{', '.join(sorted(DFLASH_ONLY))}), or for KIND (plain or dflash) alone. KEY: a field of modeld's Tuning "
        f"({', '.join(TUNING_KEYS)}) or {' or '.join(FLAG_KEYS)}. Default: {shown}",
    )
    p.set_defaults(default_ablations=default_ablations)


def rows_from_args(p: argparse.ArgumentParser, args) -> list[Row]:
    """The rows --rows and --ablate ask for; a usage error for a kind that is unknown or needs a missing draft, and
    for an --ablate that would change no row."""
    kinds = args.rows.split(",") if args.rows else ["plain"] if args.draft == "none" else list(KINDS)
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        p.error(f"--rows: {', '.join(unknown)} is not one of {', '.join(KINDS)}")
    ablations = args.ablate if args.ablate is not None else [parse_ablation(a) for a in args.default_ablations]
    rows = rows_for(kinds, ablations)
    for unused in (a for a in args.ablate or () if all(r.ablation is not a for r in rows)):
        p.error(f"--ablate {unused.spec} changes no row of --rows {','.join(kinds)}: write dflash:{unused.spec}")
    if args.draft == "none" and any(r.kind == "dflash" for r in rows):
        p.error("a DFLASH row needs a draft: drop --draft none, or ask for plain rows only")
    if not rows:
        p.error("no rows to run")
    return rows
