"""A text environment pcsd can train on (docs/environments.md): copy this file and change the game.

python -m pcsd.train env.name=gym env.entry_point=examples.keydoor:KeyDoorEnv env.kwargs.colors=3 method=grpo
"""

import string

import gymnasium as gym
from gymnasium import spaces

COLORS = ("red", "blue", "green", "yellow", "white", "black")
TEXT = spaces.Text(max_length=2048, charset=string.printable)


class KeyDoorEnv(gym.Env):
    """The task names a door; take the key of its colour, then open it (reward 1, ``won``).
    Opening a door ends the episode; an unknown action changes nothing."""

    observation_space, action_space = TEXT, TEXT

    def __init__(self, colors: int = 3):
        if not 2 <= colors <= len(COLORS):
            raise ValueError(f"colors: expected 2..{len(COLORS)}, got {colors}")
        self.num_colors = colors

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)  # seeds self.np_random: the same seed, the same task
        self.colors = [str(c) for c in self.np_random.permutation(COLORS)[: self.num_colors]]
        self.goal = self.colors[int(self.np_random.integers(self.num_colors))]
        self.key = None
        info = {"task": f"open the {self.goal} door", "task_type": "keydoor"}
        return self._page("You are in a hall."), {**info, **self._actions()}

    def step(self, action: str):
        words = action.split()
        if len(words) == 3 and words[1] in self.colors and words[0] == "take" and words[2] == "key":
            self.key = words[1]
            return self._page(f"You take the {self.key} key."), 0.0, False, False, self._actions()
        if len(words) == 3 and words[1] in self.colors and words[0] == "open" and words[2] == "door":
            won = words[1] == self.goal and self.key == self.goal
            text = "The door opens: you are out!" if won else "The door stays locked."
            return self._page(text), float(won), True, False, {"won": won, **self._actions()}
        return self._page("Nothing happens."), 0.0, False, False, self._actions()

    def expert_action(self) -> str:  # optional: demonstrations for the warm-up
        return f"take {self.goal} key" if self.key != self.goal else f"open {self.goal} door"

    def _page(self, text: str) -> str:
        held = f"the {self.key} key" if self.key else "nothing"
        return f"{text} Keys and doors: {', '.join(self.colors)}. You hold {held}. Exit: the {self.goal} door."

    def _actions(self) -> dict:
        return {"admissible_actions": [f"take {c} key" for c in self.colors] + [f"open {c} door" for c in self.colors]}
