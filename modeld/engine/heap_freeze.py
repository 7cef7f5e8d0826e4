"""The engine process's heap frozen once it serves: the model's modules, the CUDA graphs and every object built
at start-up go into the interpreter's permanent generation, so a full garbage collection (Python starts one on its
own now and then) no longer walks them in the middle of a step. With the default model's engine built, a full
collection walked about 375,000 objects and took about 200 ms on the CPU; frozen, it walks only what serving made
since (BENCHMARKS.md, the front and the host). SGLang and vLLM freeze their heaps after warm-up for the same reason.

Invariant: nothing frozen is garbage that needs the cycle collector while it stays frozen. A re-attach to memd
replaces the CUDA graphs and the pools' views (the old ones may sit in reference cycles): the heap is thawed,
collected and frozen again after it (refreeze)."""

import gc
import logging

log = logging.getLogger("modeld")


def freeze_heap(reason: str) -> int:
    """Collects, then freezes every object alive; returns how many are frozen."""
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.info("heap frozen %s: %d objects out of the garbage collector's reach", reason, frozen)
    return frozen


def refreeze(reason: str) -> int:
    """Thaws the heap so that what became garbage since the last freeze is collected, then freezes it again."""
    gc.unfreeze()
    return freeze_heap(reason)
