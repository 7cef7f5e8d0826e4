"""What the engine tells an observer at the boundaries of a step's phases, for benchmarks and tests that time or
count them without reaching into private methods. Called on the engine thread; `enter(phase)` and `leave(phase)`
come in pairs, and a phase is never nested in itself:

- "plan", "run", "commit", "emit": the parts of every engine step (modeld.engine.loop). "run" holds the step's
  device work and the wait for its tokens, and in it (modeld.runner.model_runner):
  - "prepare": packing the inputs and their copy to the device;
  - "draft": the DFLASH drafts of a step's verify items (a step of one forward);
  - "forward": the launch of the target's work: one forward, a replay of several steps (greedy DFLASH cycles, the
    drafts included), a decode chain (its sampling and draft context included), or a decode step queued ahead;
  - "sample": picking a step's tokens from its logits (or the graph's argmax); in it, "mask": the host building
    the grammar masks of the step's constrained requests (modeld.runner.host_rules);
- "memd alloc", "memd free", "memd match", "memd match batch": a call to memd the engine thread waits for; "memd
  send": a call sent ahead (its sending alone); "memd answer": the wait for a call sent ahead, entered only when
  its answer has not come yet. Inside "plan", "commit" or an idle pass.

`committed(results)` follows "commit" with the step's ItemResults (modeld.runner.model_runner): what each item
committed in each device step.

The default does nothing: each boundary costs the engine one method call. An observer's methods run inside the
step they observe, so they must be short (read a clock, record a CUDA event, count); one that synchronises the
device attributes the device's time to the phase it leaves, and undoes the overlap of host and device."""


class EngineHooks:
    def enter(self, phase: str) -> None:
        pass

    def leave(self, phase: str) -> None:
        pass

    def committed(self, results) -> None:
        pass
