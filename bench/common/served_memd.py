"""memd as a row of bench.common.rows needs it: the KV settings a benchmark gives, and everything else memd's
default for that kind. modeld reads its prefill chunk and decode lookahead from memd's layout, so a row runs as
served only against memd's defaults for its kind: without a draft pool (plain; lookahead 32) or with one (DFLASH;
lookahead 96)."""

import contextlib
from dataclasses import dataclass

from bench.common.memd_process import memd_process

CPU_KV_BYTES = 1 << 30  # shared memory on a CPU machine: enough for the CPU's batches, small beside its RAM


@dataclass(frozen=True)
class MemdSettings:
    target: str
    draft: str | None  # the draft whose pool DFLASH rows use (None: no DFLASH rows)
    page: int = 16
    max_running: int = 16
    ratio: float = 0.25  # the draft pool's share of the target's tokens
    window: int = 256  # the draft pool's window in tokens
    device: str = "cuda"


def memd_flags(kind: str, settings: MemdSettings) -> list[str]:
    """memd's flags for rows of this kind: the draft pool for DFLASH, none for plain; on the GPU with bf16 KV in 30% of
    its memory, on the CPU with the target's dtype in CPU_KV_BYTES."""
    flags = [
        "--device",
        settings.device,
        "--target-model",
        settings.target,
        "--page-size",
        str(settings.page),
        "--max-running-requests",
        str(settings.max_running),
        *(
            ["--mem-fraction", "0.3", "--kv-cache-dtype", "bfloat16"]
            if settings.device == "cuda"
            else ["--kv-budget-bytes", str(CPU_KV_BYTES)]
        ),
    ]
    if kind == "dflash":
        return flags + [
            "--draft-model",
            settings.draft,
            "--draft-kv-ratio",
            str(settings.ratio),
            "--draft-window",
            str(settings.window),
        ]
    return flags + ["--draft-model", "none"]


@contextlib.contextmanager
def served_memd(kind: str, settings: MemdSettings):
    """Yields the address of a memd child process for rows of this kind."""
    with memd_process(*memd_flags(kind, settings)) as address:
        yield address
