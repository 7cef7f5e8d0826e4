"""Where an in-process engine's decode steps spend their time, phase by phase (bench.engine.speed's breakdown), from
the engine's hooks (modeld.engine.hooks): the runner's phases end with a device synchronise, so the device's time
lands in the phase that queued it (which undoes the overlap of host and device: these runs are timed apart)."""

import time

import torch

from bench.common.engine_hooks import PhaseTimer, SwitchableHooks, device_steps, is_waited_memd_call

# The runner's phases, each ended by a synchronise, and the breakdown's phase each counts in: packing the inputs and
# their copy count as forward, as does a decode chain's sampling (it runs inside "forward", timed whole: a
# synchronise inside a chain would stop the host from running ahead of the device, which is what a chain is for).
DEVICE_PHASES = {"prepare": "forward", "forward": "forward", "draft": "draft", "sample": "sampling"}


class Breakdown(PhaseTimer):
    """Phase times of an engine per decode step (a replay of k steps counts k; a DFLASH verify step is one), while
    attached to the hooks the engine was built with (from construction to close())."""

    PHASES = ("forward", "draft", "sampling", "memd")

    def __init__(self, hooks: SwitchableHooks):
        super().__init__()
        self.hooks = hooks
        self.synchronise = torch.cuda.synchronize if torch.cuda.is_available() else lambda: None
        self.totals, self.steps, self.step_time = dict.fromkeys(self.PHASES, 0.0), 0, 0.0
        self.memd_idle = 0.0  # memd time of passes that ran nothing (releases flushed after the last step)
        self.memd_calls = 0  # calls the engine waited for, in passes that ran a step
        self._new_pass(None)
        hooks.attach(self)

    def _new_pass(self, began: float | None) -> None:
        """A pass's counts start empty; `began`: when its "plan" was entered (None: between passes)."""
        self.pass_began, self.ran, self.pass_steps, self.pass_calls = began, False, 0, 0
        self.current = dict.fromkeys(self.PHASES, 0.0)

    def enter(self, phase: str) -> None:
        if phase == "plan":
            if not self.ran:  # the pass before ran nothing (a pass whose run failed is dropped whole)
                self.memd_idle += self.current["memd"]
            self._new_pass(time.perf_counter())
        elif phase == "run":
            self.ran = True
        super().enter(phase)

    def leave(self, phase: str) -> None:
        if phase in DEVICE_PHASES:
            self.synchronise()
        super().leave(phase)
        if phase == "emit" and self.pass_began is not None:
            self.steps += self.pass_steps
            self.step_time += time.perf_counter() - self.pass_began
            self.memd_calls += self.pass_calls
            for name, seconds in self.current.items():
                self.totals[name] += seconds
            self._new_pass(None)

    def timed(self, phase: str, seconds: float) -> None:
        if phase in DEVICE_PHASES:
            self.current[DEVICE_PHASES[phase]] += seconds
        elif is_waited_memd_call(phase):
            self.current["memd"] += seconds
            self.pass_calls += 1

    def committed(self, results) -> None:
        self.pass_steps = device_steps(results)

    def close(self) -> dict:
        """Detaches; milliseconds per decode step of each phase, the host's rest and the whole step, memd's waited
        calls per 100 steps, and the memd time of passes that ran nothing per step."""
        self.hooks.detach()
        per_step = {k: 1000 * v / max(self.steps, 1) for k, v in self.totals.items()}
        step_ms = 1000 * self.step_time / max(self.steps, 1)
        per_step["host"] = step_ms - sum(per_step.values())
        per_step["step"] = step_ms
        per_step["memd_calls_per_100_steps"] = 100 * self.memd_calls / max(self.steps, 1)
        per_step["memd_idle"] = 1000 * self.memd_idle / max(self.steps, 1)
        return per_step
