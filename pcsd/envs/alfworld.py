"""The native ALFWorld engine.

:class:`AlfworldGame` plays one ``game.tw-pddl`` file exactly like alfworld 0.4.2 / TextWorld 1.7.0
(``textworld.envs.pddl.PddlEnv`` with ``AlfredDemangler(shuffle=False)`` and ``AlfredInfos``, a
step limit, and a finished game that keeps returning its last state): for the same commands it
returns byte-identical observations, the same sorted admissible commands and the same
score / done / won, about a thousand times faster. The engine (``rust_envpool/src/alfworld``)
interprets the game's PDDL domain and problem and its text grammar; nothing is hard-coded.

Example::

    from pcsd.envs.alfworld import AlfworldGame

    g = AlfworldGame.from_file(".../game.tw-pddl")
    obs, info = g.reset()
    obs, score, done, info = g.step(info["admissible_commands"][0])
"""

from __future__ import annotations

import os
from typing import Any

from pcsd import _native

#: ALFWorld task type -> the paper's column name (Table 1), in the paper's column order.
CATEGORIES: dict[str, str] = {
    "pick_and_place_simple": "Pick",
    "look_at_obj_in_light": "Look",
    "pick_clean_then_place_in_recep": "Clean",
    "pick_heat_then_place_in_recep": "Heat",
    "pick_cool_then_place_in_recep": "Cool",
    "pick_two_obj_and_place": "Pick2",
}
CATEGORY_ORDER: tuple[str, ...] = tuple(CATEGORIES.values())

#: The six ALFWorld task types.
TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)


def _check_max_steps(max_steps: Any) -> int:
    if isinstance(max_steps, bool) or not isinstance(max_steps, int):
        raise TypeError(f"max_steps must be an int, got {type(max_steps).__name__}")
    if max_steps < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps}")
    return max_steps


class AlfworldGame:
    """One ALFWorld game on the native engine.

    Build it with :meth:`from_file` or :meth:`from_json`. ``reset()`` returns ``(obs, info)``
    and ``step(command)`` returns ``(obs, score, done, info)``; ``info`` holds
    ``admissible_commands`` (sorted list of str), ``won`` (bool) and ``task_type`` (str).
    Every command counts toward ``max_steps`` (default 50), admissible or not; a command that is
    not exactly an admissible command after stripping outer whitespace answers
    ``"Nothing happens."`` and changes nothing. Once ``done`` is true the game keeps returning
    its last state until :meth:`reset`.
    """

    __slots__ = ("_g",)

    def __init__(self, _native_game: Any) -> None:
        self._g = _native_game

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], max_steps: int = 50) -> "AlfworldGame":
        """Loads a ``game.tw-pddl`` file.

        Raises FileNotFoundError (naming the path) when it does not exist, ValueError naming the
        file and the bad key when it is corrupt, TypeError for a non-path argument.
        """
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
        max_steps = _check_max_steps(max_steps)
        path = os.fspath(path)
        if not os.path.exists(path):
            raise FileNotFoundError(f"ALFWorld game file not found: {path}")
        return cls(_native.require("_envpool").AlfworldGame.from_file(path, max_steps))

    @classmethod
    def from_json(cls, text: str, max_steps: int = 50, source: str = "<json>") -> "AlfworldGame":
        """Loads a game from the JSON text of a ``game.tw-pddl`` file (``source`` names it in errors)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str holding game.tw-pddl JSON, got {type(text).__name__}")
        if not isinstance(source, str):
            raise TypeError(f"source must be a str, got {type(source).__name__}")
        max_steps = _check_max_steps(max_steps)
        return cls(_native.require("_envpool").AlfworldGame.from_json(text, max_steps, source))

    @classmethod
    def generate(cls, task_type: str, seed: int, max_steps: int = 50, **difficulty: Any) -> "AlfworldGame":
        """A procedurally generated game (``pcsd.envs.procedural.generate_game_json``).

        PROCEDURAL HOOK: the generator is written separately and wired in at merge; this method
        only forwards to it and loads the JSON it returns.
        """
        from pcsd.envs.procedural import generate_game_json  # lazy: optional module

        return cls.from_json(
            generate_game_json(task_type, seed, **difficulty),
            max_steps=max_steps,
            source=f"<generated {task_type} seed={seed}>",
        )

    def reset(self) -> tuple[str, dict[str, Any]]:
        """Starts the game over; returns ``(obs, info)``."""
        return self._g.reset()

    def step(self, command: str) -> tuple[str, float, bool, dict[str, Any]]:
        """Plays one command; returns ``(obs, score, done, info)``."""
        if not isinstance(command, str):
            raise TypeError(f"command must be a str, got {type(command).__name__}")
        return self._g.step(command)

    def expert_plan(self) -> list[str] | None:
        """Commands that win the game from the current state (None if no plan was found)."""
        return self._g.expert_plan()

    @property
    def admissible_commands(self) -> list[str]:
        """Sorted admissible commands of the current state."""
        return self._g.admissible_commands()

    @property
    def task(self) -> str:
        """The task text (after ``"Your task is to: "``)."""
        return self._g.task

    @property
    def task_type(self) -> str:
        """One of :data:`TASK_TYPES`, read from the game's goal."""
        return self._g.task_type

    @property
    def max_steps(self) -> int:
        return self._g.max_steps

    @property
    def steps(self) -> int:
        """Commands played since the last reset."""
        return self._g.steps

    @property
    def walkthrough(self) -> list[str]:
        """The walkthrough stored in the game file (may be empty)."""
        return self._g.walkthrough

    def __repr__(self) -> str:
        return f"AlfworldGame(task_type={self.task_type!r}, task={self.task!r}, source={self._g.source!r})"
