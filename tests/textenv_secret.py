"""A text env whose teacher should know what the student cannot see (tests/test_privileged.py):
three doors, one leads out (drawn from the seed); the task does not say which, ``info["privileged"]``
does. After a wrong door, the privileged text says so again (a step's info replaces it), or with
``clear`` the step's info clears it (``info["privileged"] = ""``)."""

from __future__ import annotations

import random


class SecretDoor:
    def __init__(self, doors: int = 3, privileged: bool = True, clear: bool = False) -> None:
        self.doors, self.give, self.clear = doors, privileged, clear
        self.right, self.t = 1, 0

    def _actions(self) -> list[str]:
        return [f"open door {d}" for d in range(1, self.doors + 1)]

    def reset(self, *, seed=None, options=None):
        self.right, self.t = random.Random(seed).randrange(self.doors) + 1, 0
        info = {"task": "leave the room", "task_type": "door", "admissible_actions": self._actions()}
        if self.give:
            info["privileged"] = f"door {self.right} leads out"
        return f"You see {self.doors} closed doors.", info

    def step(self, action):
        self.t += 1
        won = action == f"open door {self.right}"
        info = {"won": won, "admissible_actions": self._actions()}
        if self.give and not won:
            info["privileged"] = "" if self.clear else f"still door {self.right}, not the one just tried"
        text = "You are out!" if won else "That door is locked."
        return text, float(won), won or self.t >= 3, False, info

    def expert_action(self) -> str:
        return f"open door {self.right}"
