"""What the benchmarks that observe an engine through its hooks (modeld.engine.hooks) share: hooks an observer can
be attached to and detached from while the engine runs, a base that times each phase, and a step's device steps."""

import time

from modeld.engine.hooks import EngineHooks

NO_OBSERVER = EngineHooks()


class SwitchableHooks(EngineHooks):
    """The hooks a benchmark builds its engine with (build_engine's `hooks`): each boundary goes to the observer
    attached now (none: nothing happens), so an engine built once can be observed for some of its runs. attach and
    detach may run on any thread: the engine thread reads the observer once per boundary, so an observer attached
    inside a step sees leaves without their enters and a pass without its start, which it must ignore."""

    def __init__(self):
        self.observer = NO_OBSERVER

    def attach(self, observer: EngineHooks) -> None:
        if self.observer is not NO_OBSERVER:
            raise RuntimeError("an observer is attached already: detach it first")
        self.observer = observer

    def detach(self) -> None:
        self.observer = NO_OBSERVER

    def enter(self, phase: str) -> None:
        self.observer.enter(phase)

    def leave(self, phase: str) -> None:
        self.observer.leave(phase)

    def committed(self, results) -> None:
        self.observer.committed(results)


class PhaseTimer(EngineHooks):
    """Hooks that time each phase from its enter to its leave and hand the seconds to `timed`. A phase is never
    nested in itself, so one start per phase name is enough; one left without its enter seen (the observer was
    attached inside it) is not timed."""

    def __init__(self):
        self.entered: dict[str, float] = {}

    def enter(self, phase: str) -> None:
        self.entered[phase] = time.perf_counter()

    def leave(self, phase: str) -> None:
        began = self.entered.pop(phase, None)
        if began is not None:
            self.timed(phase, time.perf_counter() - began)

    def timed(self, phase: str, seconds: float) -> None:
        pass


def device_steps(results) -> int:
    """Device steps one engine step ran (a replay of k steps: k; a DFLASH verify step: one), from its ItemResults."""
    return max((len(result.steps) for result in results), default=0)


def is_waited_memd_call(phase: str) -> bool:
    """A memd call the engine thread waited for: every memd phase but the sending of a call sent ahead ("memd
    answer", the wait for that call's answer, is one)."""
    return phase.startswith("memd ") and phase != "memd send"
