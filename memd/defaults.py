"""Where the project's default target and draft live.

The target (SmolLM2-135M-Instruct) is converted once into a cache folder by
`python -m modeld.fetch_default`; the draft's folder ships inside the modeld package.
"""

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
