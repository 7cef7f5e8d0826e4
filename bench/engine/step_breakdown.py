"""Where an in-process engine's decode steps spend their time, phase by phase (bench.engine.speed's breakdown): its
runner, draft, sampler and memd calls wrapped with timers that synchronise the device after each phase."""

import time

import torch

import modeld.engine.loop


class Breakdown:
    """Phase times of an engine per decode step (a replay of k steps counts k; a DFLASH verify step is one), each
    phase ended by a device synchronise."""

    PHASES = ("forward", "draft", "sampling", "memd")

    def __init__(self, engine):
        self.engine, self.totals, self.steps, self.step_time = engine, dict.fromkeys(self.PHASES, 0.0), 0, 0.0
        self.current_steps = 1  # decode steps of the pass under way (runner.steps_ahead's choice)
        self.current = dict.fromkeys(self.PHASES, 0.0)  # the step under way; kept only if it was a step
        self.current_calls = 0
        self.memd_idle = 0.0  # memd time of idle passes (releases flushed after the last step): no step's time
        self.memd_calls = 0  # calls the engine waited for
        self.inside = False  # within a call timed whole (a decode chain): its parts are not timed apart
        self.undo = []
        runner, sched = engine.runner, engine.scheduler
        self._wrap(runner, "prepare", "forward")
        self._wrap(runner, "forward", "forward")
        self._wrap(runner, "replay_decode_steps", "forward")
        steps_ahead = runner.steps_ahead

        def counted_steps(*a):
            self.current_steps = steps_ahead(*a)
            return self.current_steps

        runner.steps_ahead = counted_steps
        self.undo.append(lambda: delattr(runner, "steps_ahead"))
        if engine.dflash is not None:
            self._wrap(engine.dflash, "propose", "draft")
            self._wrap(engine.dflash, "replay_greedy_cycles", "forward")  # greedy verify steps: draft included
        self._wrap(sched.memd.session, "alloc", "memd")
        self._wrap(sched.memd.session, "free", "memd")
        self._wrap(sched.memd.session, "match_prefix", "memd")
        self._wrap(sched.memd, "_await_answer", "memd", waited=lambda future: not future.done())  # a call sent ahead
        self._wrap(modeld.engine.loop, "sample", "sampling")
        # a chain of decode steps (sampling, the draft's context) counts as forward, timed whole: a synchronise
        # inside it would stop the host from running ahead of the device, which is what a chain is for
        self._wrap(modeld.engine.loop, "decode_chain", "forward", whole=True)
        step = engine._step

        def timed_step():
            self.current, self.current_calls, self.current_steps = dict.fromkeys(self.PHASES, 0.0), 0, 1
            begin = time.perf_counter()
            busy = step()
            if busy:
                self.steps += self.current_steps
                self.step_time += time.perf_counter() - begin
                self.memd_calls += self.current_calls
                for phase, seconds in self.current.items():
                    self.totals[phase] += seconds
            else:
                self.memd_idle += self.current["memd"]
            return busy

        engine._step = timed_step
        self.undo.append(lambda: delattr(engine, "_step"))

    def _wrap(self, owner, name, phase, waited=lambda *a: True, whole=False):
        original = getattr(owner, name)

        def timed(*a, **kw):
            if self.inside:  # a part of a call timed whole
                return original(*a, **kw)
            begin = time.perf_counter()
            self.current_calls += phase == "memd" and waited(*a)
            self.inside = whole
            try:
                out = original(*a, **kw)
            finally:
                self.inside = False
            torch.cuda.synchronize()
            self.current[phase] += time.perf_counter() - begin
            return out

        setattr(owner, name, timed)
        self.undo.append(lambda: setattr(owner, name, original))

    def close(self) -> dict:
        for undo in reversed(self.undo):
            undo()
        per_step = {k: 1000 * v / max(self.steps, 1) for k, v in self.totals.items()}
        step_ms = 1000 * self.step_time / max(self.steps, 1)
        per_step["host"] = step_ms - sum(per_step.values())
        per_step["step"] = step_ms
        per_step["memd_calls_per_100_steps"] = 100 * self.memd_calls / max(self.steps, 1)
        per_step["memd_idle"] = 1000 * self.memd_idle / max(self.steps, 1)
        return per_step
