"""A text env whose outcome is a coin the model's own text tosses (tests/test_family.py): two steps,
the second won when the CRC-32 of the action is even. An untrained model's episodes of one task
then both win and lose, so a run has a group's successes for the teacher's context and non-zero
GRPO advantages without skills, without ``info["privileged"]`` and without a warm-up."""

from __future__ import annotations

import zlib


class CoinDoor:
    def _info(self) -> dict:
        return {"task": "leave the room", "task_type": "door", "admissible_actions": ["open door"]}

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return "Two doors, one after the other.", self._info()

    def step(self, action):
        self.t += 1
        won = self.t == 2 and zlib.crc32(action.encode("utf-8", "replace")) % 2 == 0
        info = {**self._info(), "won": won}
        return ("You are out!" if won else "A door opens onto another."), float(won), self.t >= 2, False, info
