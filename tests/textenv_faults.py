"""Text envs that misbehave on purpose, for tests/test_pypool.py and tests/test_textenv.py: each
follows the protocol until the seed ``bad_seed`` (default 13) meets step ``at``, then raises, hangs,
exits, segfaults, or returns something outside the protocol. Imported by the pool's worker
processes by name (``textenv_faults:Name``), as a user's module would be."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path


class Counter:
    """A deterministic env: observation ``"<seed>:<step>:<last action>"``, task ``"count <seed>"``,
    reward 1 per step, ``terminated`` after ``length`` steps; ``won`` when every action was
    ``"go"``. Misbehaves as the subclasses say when reset with ``bad_seed``."""

    def __init__(self, length: int = 4, bad_seed: int = 13, at: int = 2, won: bool = True) -> None:
        self.length, self.bad_seed, self.at, self.report_won = length, bad_seed, at, won
        self.seed, self.t, self.all_go = 0, 0, True

    def reset(self, *, seed=None, options=None):
        self.seed, self.t, self.all_go = seed, 0, True
        if seed == self.bad_seed and self.at == 0:
            self.fault()
        info = {"task": f"count {seed}", "admissible_actions": ["go", "stop"], "task_type": "count"}
        if options:
            info["task"] += f" {sorted(options.items())}"
        return f"{seed}:0:", info

    def step(self, action):
        self.t += 1
        self.all_go &= action == "go"
        if self.seed == self.bad_seed and self.t == self.at:
            self.fault()
        done = self.t >= self.length
        info = {"admissible_actions": ["go", "stop"]}
        if done and self.report_won:
            info["won"] = self.all_go
        return f"{self.seed}:{self.t}:{action}", 1.0, done, False, info

    def expert_action(self):
        return "go"

    def fault(self):
        pass


class Raises(Counter):
    def fault(self):
        raise RuntimeError("boom at step %d" % self.t)


class Hangs(Counter):
    def fault(self):
        mark = os.environ.get("PCSD_TEST_HANG_MARK")
        if mark:  # tells a test it is hung now (a readiness signal instead of a sleep)
            Path(f"{mark}.{os.getpid()}").touch()
        time.sleep(3600)


class Exits(Counter):
    def fault(self):
        os._exit(3)


class Segfaults(Counter):
    def fault(self):
        import ctypes

        ctypes.string_at(0)


class NonText(Counter):
    def step(self, action):
        obs, r, term, trunc, info = super().step(action)
        return (12345 if self.seed == self.bad_seed else obs), r, term, trunc, info


class OldGymStep(Counter):
    def step(self, action):
        obs, r, term, trunc, info = super().step(action)
        return obs, r, term or trunc, info


class BadInfo(Counter):
    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        info["admissible_actions"] = "go"
        return obs, info


class BadAnchor(Counter):
    def step(self, action):
        obs, r, term, trunc, info = super().step(action)
        info["anchor"] = 7
        return obs, r, term, trunc, info


class Anchored(Counter):
    """Well-behaved: ``info["anchor"]`` names the state without the last action (``"<step>"``), so the
    two envs of a group share their anchor at every step whatever they said; reward 1 for ``go``."""

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        info["anchor"] = "0"
        return obs, info

    def step(self, action):
        obs, _, term, trunc, info = super().step(action)
        info["anchor"] = str(self.t)
        return obs, float(action == "go"), term, trunc, info


class NotDeterministic(Counter):
    """Its observations draw on an unseeded generator: a replay cannot reach the same state."""

    def step(self, action):
        obs, r, term, trunc, info = super().step(action)
        return obs + f":{random.SystemRandom().random()}", r, term, trunc, info


class NoTask(Counter):
    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        del info["task"], info["admissible_actions"]
        return obs, info

    def step(self, action):
        obs, r, term, trunc, info = super().step(action)
        info.pop("admissible_actions")
        return obs, r, term, trunc, info


class NeedsArg:
    def __init__(self, size):
        self.size = size


def not_a_class():
    raise ValueError("cannot build this one")


class NoExpert(Counter):
    """No expert_action: the trainer skips the warm-up with a message."""

    expert_action = None


class Surrogate(Counter):
    """Returns an observation that is not valid text (a lone surrogate) at the bad seed's step ``at``."""

    def step(self, action):
        obs, r, term, trunc, info = super().step(action)
        if self.seed == self.bad_seed and self.t == self.at:
            obs = "broken \ud800 text"
        return obs, r, term, trunc, info


class Flaky(Counter):
    """Every episode's step ``fail_step`` raises (for every seed; 0: never); a reset with a seed of
    at least ``fail_reset_from`` raises (the evaluation seeds are 10**9 and up)."""

    def __init__(self, length: int = 3, fail_step: int = 0, fail_reset_from: int = 0) -> None:
        super().__init__(length=length)
        self.fail_step, self.fail_reset_from = fail_step, fail_reset_from

    def reset(self, *, seed=None, options=None):
        if self.fail_reset_from and seed is not None and seed >= self.fail_reset_from:
            raise RuntimeError(f"no such level {seed}")
        return super().reset(seed=seed, options=options)

    def step(self, action):
        if self.fail_step and self.t + 1 == self.fail_step:
            raise ValueError(f"the floor gave way at step {self.fail_step}")
        return super().step(action)
