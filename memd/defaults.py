"""Where the project's default target and draft live.

The target (SmolLM2-135M-Instruct) is converted once into a cache folder by
`python -m modeld.model.fetch_default`; the draft's folder ships inside the modeld package.
"""

import json
import os
import pathlib

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


def cache_root() -> pathlib.Path:
    root = os.environ.get("DFLASH_SERVE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "dflash-serve"
    )
    return pathlib.Path(root)


def default_target_dir() -> pathlib.Path:
    return cache_root() / DEFAULT_MODEL_NAME


def default_draft_dir() -> pathlib.Path:
    return pathlib.Path(__file__).resolve().parent.parent / "modeld" / "default_draft"


def draft_folder(name: str) -> str:
    """A --draft-model value as a folder: 'default' (any case) names the project's draft."""
    return str(default_draft_dir()) if name.lower() == "default" else name


# DFLASH is the default on CUDA for the default target: with the shipped draft it beat plain decoding at batch 1,
# 16 and 64 on the H200 (BENCHMARKS.md, seventh engine run). memd then keeps a draft pool of this fraction of the
# target's tokens, with the draft's own window.
DEFAULT_DRAFT_KV_RATIO = 0.25


def default_decode_lookahead(draft: bool) -> int:
    """Decode positions a request holds ahead of need unless --decode-lookahead says otherwise: 32 for plain
    decoding; 96 with a draft, so that a graph replay of four greedy verify blocks of 16 (modeld's
    Tuning.steps_per_replay) fits in the spare a request keeps until its top-up comes due (half the lookahead used:
    16 + 96 / 2 >= 4 x 16). With 32 a replay ran one or two blocks."""
    return 96 if draft else 32


def default_draft_window() -> int:
    """The shipped draft's sliding window (every layer of it slides)."""
    return int(json.loads((default_draft_dir() / "config.json").read_text())["sliding_window"])


def dflash_by_default(device: str, target_model: str | None) -> bool:
    """Whether a daemon given no draft settings runs DFLASH with the shipped draft: on CUDA, for the default target."""
    return device == "cuda" and target_model is None


def runtime_dir() -> pathlib.Path:
    """Owner-only folder for Unix sockets."""
    base = os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/dflash-serve-{os.getuid()}"
    path = pathlib.Path(base) / "dflash-serve" if os.environ.get("XDG_RUNTIME_DIR") else pathlib.Path(base)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def default_memd_address() -> str:
    return f"unix://{runtime_dir() / 'memd.sock'}"


def default_modeld_address() -> str:
    return f"unix://{runtime_dir() / 'modeld.sock'}"
