"""A deterministic test env in Python: the twin of the native pool's ``dummy`` kind, for the tests
and benchmarks of :mod:`pcsd.envs.pypool` (no Gymnasium needed).

:class:`DirectionEnv` asks, at every step, for a direction (``left`` or ``right``, drawn from the
reset's seed) and rewards the right answer; ``busy_iters`` adds CPU work per step (integer
mixing, for the scaling benchmark), ``expert_action`` gives the right answer.
"""

from __future__ import annotations

import random
from typing import Any, Optional

__all__ = ["DirectionEnv", "busy"]

_DIRECTIONS = ("left", "right")


def busy(iters: int, x: int = 1) -> int:
    """``iters`` rounds of integer mixing: pure-Python CPU work that holds the GIL."""
    for _ in range(iters):
        x = (x * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
    return x


class DirectionEnv:
    """Say the direction the observation asks for; ``episode_len`` steps per episode.

    ``info`` at reset: ``task``, ``admissible_actions`` (``["left", "right"]``), ``task_type``
    (``"direction"``); after each step: ``admissible_actions`` and ``won`` (every answer right, on
    the last step). Reward 1 per right answer."""

    def __init__(self, episode_len: int = 5, busy_iters: int = 0) -> None:
        if episode_len < 1:
            raise ValueError(f"episode_len: expected >= 1, got {episode_len}")
        self.episode_len = episode_len
        self.busy_iters = busy_iters
        self._rng = random.Random(0)
        self._want = "left"
        self._t = 0
        self._right = 0

    def _ask(self) -> str:
        self._want = _DIRECTIONS[self._rng.randrange(2)]
        return f"step {self._t}: say {self._want}"

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None) -> tuple[str, dict]:
        self._rng = random.Random(seed)
        self._t, self._right = 0, 0
        obs = self._ask()
        return obs, {
            "task": "say the direction each observation asks for",
            "admissible_actions": list(_DIRECTIONS),
            "task_type": "direction",
        }

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.busy_iters:
            busy(self.busy_iters)
        right = action.strip() == self._want
        self._right += right
        self._t += 1
        done = self._t >= self.episode_len
        info: dict[str, Any] = {"admissible_actions": list(_DIRECTIONS)}
        if done:
            info["won"] = self._right == self.episode_len
        return self._ask(), float(right), done, False, info

    def expert_action(self) -> str:
        return self._want
