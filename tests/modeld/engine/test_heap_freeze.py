"""The engine process's heap frozen once it serves (modeld.engine.heap_freeze): what is alive then leaves the garbage
collector's generations, and a re-freeze after a re-attach lets what became cyclic garbage meanwhile (the old CUDA
graphs' objects, say) be collected."""

import gc
import weakref

import pytest

from modeld.engine.heap_freeze import freeze_heap, refreeze


class Node:
    """A container in a reference cycle with itself: only the cycle collector frees it."""

    def __init__(self):
        self.me = self


@pytest.fixture(autouse=True)
def thawed():
    gc.unfreeze()
    yield
    gc.unfreeze()  # what this test froze goes back to the collector's generations


def tracked(obj) -> bool:
    return any(o is obj for o in gc.get_objects())


def test_freezing_takes_the_live_heap_out_of_the_collectors_reach():
    alive = Node()
    assert tracked(alive)
    frozen = freeze_heap("in a test")
    # what it froze; frozen objects may die since (another thread's), but nothing joins without another freeze
    assert 0 < gc.get_freeze_count() <= frozen
    assert not tracked(alive), "a frozen object is still in a generation a full collection walks"


def test_a_refreeze_collects_the_cycles_that_became_garbage_while_frozen():
    old = Node()
    gone = weakref.ref(old)
    freeze_heap("in a test")
    del old  # garbage now, but frozen: a collection does not see it
    gc.collect()
    assert gone() is not None
    refreeze("in a test")
    assert gone() is None, "the cycle frozen before the re-attach was not collected"
    assert gc.get_freeze_count() > 0, "the heap is frozen again"
