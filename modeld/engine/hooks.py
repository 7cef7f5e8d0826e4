"""What the engine tells an observer at the boundaries of a step's phases, for benchmarks and tests that time or
count them without reaching into private methods. The engine calls `enter(phase)` and `leave(phase)` on its own
thread, in pairs, phases nested at most two deep:

- "plan", "run", "commit", "emit": the parts of every engine step (modeld.engine.loop); "run" holds the device
  work and the wait for the step's tokens;
- "memd alloc", "memd free", "memd match", "memd answer": a call to memd the engine thread waits for ("memd
  answer": the answer to a call sent ahead, entered only when it has not come yet), inside "plan", "commit" or an
  idle pass.

The default does nothing: each boundary costs the engine one method call. An observer's own methods run inside
the step they observe, so they must be short (read a clock, count)."""


class EngineHooks:
    def enter(self, phase: str) -> None:
        pass

    def leave(self, phase: str) -> None:
        pass
