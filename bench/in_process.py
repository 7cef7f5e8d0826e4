"""modeld's engine built and run in a benchmark's own process (no gRPC in front of it)."""

import contextlib

from modeld.config import ModeldConfig
from modeld.server import build_engine


@contextlib.contextmanager
def running_engine(cfg: ModeldConfig):
    """The engine attached to cfg.memd and started; on exit stopped (what runs fails) and its memd session closed."""
    built = build_engine(cfg, lambda serving: None)
    built.engine.start()
    try:
        yield built.engine
    finally:
        built.engine.stop()
        built.link.close()
