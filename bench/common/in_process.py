"""modeld's engine built and run in a benchmark's own process (no gRPC in front of it)."""

import contextlib

from modeld.config import ModeldConfig
from modeld.engine.build import build_engine


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


class Patches:
    """Attributes replaced while a benchmark measures (an object's method, a module's function), put back by undo():
    an attribute the owner did not hold itself (a method of its class) is deleted again, not left as a copy."""

    def __init__(self):
        self.replaced = []

    def replace(self, owner, name: str, make) -> None:
        """owner.name = make(the original) until undo()."""
        original = getattr(owner, name)
        self.replaced.append((owner, name, original, name in vars(owner)))
        setattr(owner, name, make(original))

    def undo(self) -> None:
        for owner, name, original, own in reversed(self.replaced):
            if own:
                setattr(owner, name, original)
            else:
                delattr(owner, name)
        self.replaced.clear()
