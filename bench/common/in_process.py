"""modeld's engine built and run in a benchmark's own process (no gRPC in front of it)."""

import contextlib

from modeld.config import ModeldConfig
from modeld.engine.build import build_engine
from modeld.engine.hooks import EngineHooks


@contextlib.contextmanager
def running_engine(cfg: ModeldConfig, hooks: EngineHooks | None = None):
    """The engine attached to cfg.memd (observed by `hooks`) and started; on exit stopped (what runs fails) and its
    memd session closed."""
    built = build_engine(cfg, lambda serving: None, hooks=hooks)
    built.engine.start()
    try:
        yield built.engine
    finally:
        built.engine.stop()
        built.close()
