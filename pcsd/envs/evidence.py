"""The evidence toy (issue 38, ``preset=tiny-cpu-evidence``): a text env built for the paper's mechanism.

Each episode puts one item on a lock (``"a red cube"``); the lock opens with a three-move code
(``dial up left out``) that depends only on the item's *type* (its colour and shape), through a
fixed mapping drawn once from ``rule_seed``: a type-level rule that holds across episodes, as the
paper's skills are, so a student can internalise it by RL. The teacher reads the rule of the
episode's type in its skills (``pcsd/train/configs/skills/evidence/<type>.md``, retrieved by
``info["task_type"]``); the student never sees it and guesses (1 code in 8 per attempt, up to
``env.max_steps`` attempts; a wrong code leaves the same state, so GiGPO's anchor groups repeat).
Every move of the code is its own decision (three tokens on which the teacher stays confident and
the blind student does not), so persistence over a local window has something to aggregate.

``rule_noise`` (0..1) is the realistic noise of the paper's introduction (imperfect retrieval):
that share of episodes reports another ``task_type`` than the item's, half of them another type (the
teacher reads a wrong rule), half ``decoy`` (a distractor that names no code).

``expert_action(privileged=...)`` is the warm-up's expert (docs/environments.md, "An expert that
knows what the teacher knows"): with ``privileged=True`` it plays the rule (the teacher's
examples), with ``privileged=False`` a blind guess among the codes not tried yet (the student's),
so the warm-up teaches the teacher to read the rule and the student nothing of it.
"""

from __future__ import annotations

import itertools
import random
from typing import Any, Optional

__all__ = ["COLOURS", "SHAPES", "MOVES", "RuleLockEnv", "all_codes", "rules", "skill_text"]

COLOURS = ("red", "blue", "green")
SHAPES = ("cube", "ball")
#: each move of the code from its own pair of words, so reading a rule is a lookup (which word of the pair
#: the context holds), not a copy of a sequence: something a two-layer model learns in a short warm-up
MOVES = (("up", "down"), ("left", "right"), ("in", "out"))
CODE_LENGTH = len(MOVES)
DECOY = "decoy"


def _type(colour: str, shape: str) -> str:
    return f"{colour}-{shape}"


def rules(rule_seed: int = 0) -> dict[str, tuple[str, ...]]:
    """The fixed mapping ``task_type -> code`` (a tuple of :data:`CODE_LENGTH` moves) of ``rule_seed``."""
    rng = random.Random(f"pcsd-evidence-rules-{rule_seed}")
    codes = list(itertools.product(*MOVES))
    return {_type(c, s): tuple(rng.choice(codes)) for c in COLOURS for s in SHAPES}


def skill_text(task_type: str, code: tuple[str, ...]) -> str:
    """The skill file of one type (what ``pcsd/train/configs/skills/evidence/<type>.md`` holds)."""
    colour, shape = task_type.split("-")
    return f"Rule: dial {' '.join(code)} opens a {colour} {shape}."  # the code's words as the action spells them


def all_codes() -> list[tuple[str, ...]]:
    return list(itertools.product(*MOVES))


DECOY_TEXT = "Rule: every lock takes a dial of three moves: up or down, left or right, in or out."


class RuleLockEnv:
    """One item per episode; the action ``dial M1 M2 M3`` (``up``/``down``, ``left``/``right``, ``in``/``out``) opens the lock
    when it is the code of the item's type (reward 1, ``won``, the episode ends); anything else leaves
    the lock shut and the same state. ``info``: ``task``, ``task_type`` (the rule the teacher reads),
    ``anchor`` (the state without history)."""

    def __init__(self, rule_seed: int = 0, rule_noise: float = 0.0):
        if not isinstance(rule_noise, (int, float)) or not 0.0 <= float(rule_noise) <= 1.0:
            raise ValueError(f"rule_noise: expected a share in [0, 1], got {rule_noise!r}")
        self.rule_seed = int(rule_seed)
        self.rule_noise = float(rule_noise)
        self.rules = rules(self.rule_seed)
        self.codes = [" ".join(c) for c in itertools.product(*MOVES)]
        self.item: Optional[str] = None

    def reset(self, *, seed: Optional[int] = None, options: Any = None) -> tuple[str, dict]:
        self.rng = random.Random(f"pcsd-evidence-{seed}")
        colour, shape = self.rng.choice(COLOURS), self.rng.choice(SHAPES)
        self.item = _type(colour, shape)
        self.name = f"{colour} {shape}"
        self.code = " ".join(self.rules[self.item])
        self.tried: list[str] = []
        reported = self.item
        if self.rng.random() < self.rule_noise:  # imperfect retrieval: a wrong rule or a distractor
            others = [t for t in self.rules if t != self.item]
            reported = self.rng.choice(others) if self.rng.random() < 0.5 else DECOY
        self.reported = reported
        # the task names no item (the student must read it from the observation, the last line of its prompt)
        info = {"task": "open the lock", "task_type": reported, "anchor": self._anchor()}
        return f"A {self.name} sits on the lock.", info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if self.item is None:
            raise RuntimeError("step() before reset()")
        words = action.split()
        guess = " ".join(words[1:]) if len(words) == CODE_LENGTH + 1 and words[0] == "dial" else None
        if guess is not None and guess not in self.tried:
            self.tried.append(guess)
        if guess == self.code:
            return "The lock opens.", 1.0, True, False, {"won": True, "anchor": "open"}
        what = "The lock stays shut." if guess is not None else "Nothing happens (dial three moves)."
        return f"{what} A {self.name} sits on the lock.", 0.0, False, False, {"anchor": self._anchor()}

    def expert_action(self, privileged: bool = True) -> str:
        """The rule's code (``privileged``: the expert reads what the teacher reads), else a blind
        guess among the codes not tried yet."""
        if privileged:
            return f"dial {self.code}"
        left = [c for c in self.codes if c not in self.tried] or self.codes
        return f"dial {self.rng.choice(left)}"

    def _anchor(self) -> str:
        return f"{self.name} on the lock"
