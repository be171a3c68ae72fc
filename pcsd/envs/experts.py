"""Experts that play ALFWorld games: demonstrations for the SFT warm-up and baselines.

The native engine's planner (:meth:`pcsd.envs.alfworld.AlfworldGame.expert_plan`) knows the whole
state, hidden objects included: from the start of a game it walks straight to the drawer that holds
the hidden plate. A policy that sees only the prompt cannot learn that move; trained on it, a model
learns a prior over receptacles and has never seen what to do when the object is not there.

:class:`ObservationExpert` plays only on what the agent has observed. It follows the planner while
the planner's next move is justified by what was seen, and searches otherwise:

* a ``go to R`` whose purpose at R is to take or use an object that no observation has shown yet
  (the planner's privileged knowledge) is replaced by a search move: the first receptacle of the
  admissible ``go to`` list (sorted, as the game lists it) not visited in this episode;
* arriving at a closed receptacle during a search, it opens it (its contents become visible);
* everything else (taking a visible object, going to the task's target receptacle or to an
  appliance that is in plain sight, heating, cleaning, putting) comes from the planner, replanned
  from the current state after every step.

So its actions depend only on the task text and the observations so far: two games that differ
only in where the hidden objects lie get the same moves until an object is seen (tested).

``navigation="sweep"`` makes every move the same simple rule, which a small model imitates far
sooner: *do what can be done here, else go to the next receptacle*. Each ``go to`` (search, the
goal, an appliance) is replaced by the receptacle that follows the current one in the game's
sorted receptacle order (cyclic; the first one from the starting point), and a closed receptacle
is opened on arrival. The planner still decides what to do at a receptacle (take, heat, put, use
the lamp, ...). It wins the same games given more steps; RL can then find the shortcuts (going to
the goal named in the task directly).

``search_first`` (``plan`` navigation): receptacle types (the name without its number, e.g.
``"dresser"``) that the search visits before the others, e.g. the types a skill text names as
where such objects are usually kept (:func:`skill_search_first`); the search is
otherwise the same (sorted order, unvisited receptacles only).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Optional, Sequence

from pcsd.envs.alfworld import AlfworldGame

__all__ = ["ObservationExpert", "ExpertEpisode", "expert_episodes", "play_expert", "skill_search_first", "NAVIGATIONS"]

#: how the expert moves between receptacles (see the module docstring)
NAVIGATIONS = ("plan", "sweep")

_GO = "go to "
_NAME = re.compile(r"[a-z]+ \d+")
# the object a planner action needs at its receptacle (take X from R, use X)
_NEEDS = (re.compile(r"^take ([a-z]+ \d+) from "), re.compile(r"^use ([a-z]+ \d+)$"))


@dataclass
class ExpertEpisode:
    """One episode of an expert: the (observation, admissible, action) triples and the outcome."""

    task: str
    task_type: str
    steps: list[tuple[str, list[str], str]] = field(default_factory=list)
    won: bool = False


class ObservationExpert:
    """An expert restricted to observed information (see the module docstring). One instance plays
    one episode: call :meth:`act` with each new observation."""

    def __init__(self, game: AlfworldGame, navigation: str = "plan", search_first: Collection[str] = ()):
        if navigation not in NAVIGATIONS:
            raise ValueError(f"navigation={navigation!r}: expected one of {', '.join(NAVIGATIONS)}")
        self.game = game
        self.navigation = navigation
        self.search_first = frozenset(search_first)
        self.seen: set[str] = set()  # names ("plate 1") that appeared in an observation
        self.visited: set[str] = set()  # receptacles arrived at
        self.opened: set[str] = set()
        self.location: Optional[str] = None
        self.arrived = False  # the last action was a go to that got there

    def observe(self, obs: str, action: Optional[str] = None) -> None:
        """Records an observation (and the action that produced it)."""
        self.seen.update(_NAME.findall(obs))
        self.arrived = False
        if action and action.startswith(_GO) and not obs.startswith("Nothing happens"):
            self.location = action[len(_GO) :]
            self.visited.add(self.location)
            self.arrived = True
        elif action and action.startswith("open ") and not obs.startswith("Nothing happens"):
            self.opened.add(action[len("open ") :])

    def _needs_unseen(self, plan: list[str]) -> bool:
        """Whether the planner's leading ``go to R`` is for an object not observed yet."""
        for a in plan[1:]:
            if a.startswith(_GO):
                return False
            for pat in _NEEDS:
                m = pat.match(a)
                if m and m.group(1) not in self.seen:
                    return True
        return False

    def act(self, admissible: list[str]) -> Optional[str]:
        """The next action, or None when the planner finds no plan from this state."""
        plan = self.game.expert_plan()
        if not plan:
            return None
        first = plan[0]
        if self.navigation == "sweep":
            return self._sweep(admissible) if first.startswith(_GO) else first
        if not (first.startswith(_GO) and self._needs_unseen(plan)):
            return first
        # search: open the closed receptacle we stand at, else the next unvisited receptacle
        here = self.location
        if here is not None and f"open {here}" in admissible and here not in self.opened:
            return f"open {here}"
        unvisited = [a for a in admissible if a.startswith(_GO) and a[len(_GO) :] not in self.visited]
        preferred = [a for a in unvisited if a[len(_GO) :].rsplit(" ", 1)[0] in self.search_first]
        if preferred or unvisited:
            return (preferred or unvisited)[0]
        return first  # everything visited: the object must be somewhere seen; follow the plan

    def _sweep(self, admissible: list[str]) -> str:
        """Open the closed receptacle just arrived at, else go to the receptacle after this one in
        the sorted order (cyclic). The admissible ``go to`` list is that order without the current
        receptacle (or receptacles sharing its location)."""
        here = self.location
        if self.arrived and f"open {here}" in admissible:
            return f"open {here}"
        gos = [a for a in admissible if a.startswith(_GO)]
        if here is None:
            return gos[0]
        here_cmd = _GO + here
        return next((a for a in gos if a > here_cmd), gos[0])


def play_expert(
    path: str, max_steps: int, navigation: str = "plan", search_first: Optional[Callable[[str], Collection[str]]] = None
) -> ExpertEpisode:
    """Plays the game at ``path`` with an :class:`ObservationExpert` for at most ``max_steps``;
    ``search_first``: task description -> the receptacle types to search first."""
    if max_steps < 1:
        raise ValueError(f"max_steps: expected at least 1, got {max_steps}")
    g = AlfworldGame.from_file(path, max_steps=max_steps)
    obs, info = g.reset()
    ep = ExpertEpisode(task=g.task, task_type=g.task_type)
    expert = ObservationExpert(g, navigation, search_first(g.task) if search_first is not None else ())
    expert.observe(obs)
    for _ in range(max_steps):
        adm = list(info["admissible_commands"])
        action = expert.act(adm)
        if action is None:
            break
        ep.steps.append((obs, adm, action))
        obs, _, done, info = g.step(action)
        expert.observe(obs, action)
        if done:
            ep.won = bool(info["won"])
            break
    return ep


def expert_episodes(
    games: Sequence[str],
    max_steps: int,
    navigation: str = "plan",
    search_first: Optional[Callable[[str], Collection[str]]] = None,
) -> list[ExpertEpisode]:
    """One :class:`ObservationExpert` episode per game file, in order (``navigation``: ``plan`` or
    ``sweep``; ``search_first``: task -> receptacle types searched first, e.g.
    :func:`skill_search_first`)."""
    return [play_expert(path, max_steps, navigation, search_first) for path in games]


def skill_search_first(skills: Any) -> Callable[[str], frozenset[str]]:
    """For the expert of the teacher's-prompt examples (``optim.sft_teacher_demos=skills``): task ->
    the words of the task's retrieved skills (``skills``: a :class:`pcsd.text.prompts.SkillRepository`,
    or None for the built-in skills); the expert searches first the receptacles whose type is one
    of them (a skill saying "keychains are usually kept in a dresser" sends it to the dressers)."""
    from pcsd.text.prompts import retrieve_skills

    def words(task: str) -> frozenset[str]:
        text = skills.retrieve(task) if skills is not None else retrieve_skills(task)
        return frozenset(re.findall(r"[a-z]+", text.lower()))

    return words
