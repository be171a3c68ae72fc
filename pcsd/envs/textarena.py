"""TextArena's single-player games as pcsd text environments.

:class:`TextArenaEnv` wraps a game of the real ``textarena`` package (``pip install
'pcsd[textarena]'``; tested with textarena 0.7.4) in pcsd's text-env protocol::

    env = TextArenaEnv("GuessTheNumber-v0")
    obs, info = env.reset(seed=3)          # info["task"]: the game's instructions
    obs, reward, terminated, truncated, info = env.step("[10]")

How the game's API maps onto the protocol (``textarena/core.py``: ``Env.reset(num_players, seed)``,
``get_observation() -> (player_id, messages)``, ``step(action) -> (done, step_info)``,
``close() -> (rewards, game_info)``):

- **Task**: the game's prompt (the ``PROMPT`` messages it sends at reset), in ``info["task"]``.
- **Observation**: the messages the game sent since the player's last move, one per line, without
  the echo of the player's own action (pcsd's history holds the actions). At reset that is every
  message of the first turn, the prompt included (TowerOfHanoi adds its board). On the last step
  the outcome (``game_info``'s reason) closes the observation.
- **Reward**: TextArena scores single-player games once, at the end: ``0.0`` on every step but the
  last, which carries the game's final reward (``close()``'s reward for player 0: ``1`` for a
  solved game, partial credit in ``[0, 1)`` for an unsolved one, ``-1`` in some games after too
  many invalid moves). ``terminated`` is the game's ``done`` (its own turn limit included);
  ``truncated`` is always ``False`` (pcsd's step limit truncates).
- **won**: on the last step, ``info["won"]`` is ``True`` when the final reward is at least 1 and
  the game did not end on an invalid move (every single-player game scores a solve as 1).
- **Invalid moves** as the game reports them: ``info["invalid_move"]`` on every step; a first
  invalid move costs nothing but the game's message in the observation ("You attempted an invalid
  move. Reason: ..."), the next one in a row ends the game (TextArena's ``error_allowance``).
- **Actions** go through the wrappers the game id registers for actions (``-v0`` ids add the square
  brackets the games parse when the action has none: ``10`` -> ``[10]``); the ids' observation
  wrappers (which re-send the whole history each turn) are not used.
- ``info["task_type"]`` is the game id; ``expert_action()`` exists for the games that have a cheap
  expert (:data:`EXPERTS`: GuessTheNumber's binary search on the game's hints, TowerOfHanoi's
  optimal move from any position).
- ``info["privileged"]``: the game's hidden state, for a privileged teacher (never the student), at
  reset and after every step, for the games that have one (:data:`PRIVILEGED`): GuessTheNumber
  (the number), Mastermind (the code), Minesweeper (where the mines are, once the first move has
  placed them), Bandit (each button's win probability), Blackjack (the dealer's hand), Crosswords
  (the words and where they go), LogicPuzzle (the solution), Sudoku (the solved grid),
  ThreeCardMonte (the ball's cup), Secretary (the values still to come). Games whose board is the
  whole state (TowerOfHanoi, Sokoban, FifteenPuzzle, LightsOut, ...) have none.

TextArena draws its randomness from the functions of Python's ``random`` module
(``random.seed(seed)`` at reset, ``random.choice`` ...). Each env has its own ``random.Random``,
whose methods stand in for the module's functions during its ``reset``/``step`` (the same
Mersenne Twister, so a seed plays the same game as in TextArena alone); envs stepped in any order
in one process stay deterministic, and the caller's ``random`` is untouched. (Swapping the
module's state with ``getstate``/``setstate`` instead costs ~130 us a call.)

Which games run here: single-player only (a multi-player id is refused when the env is made). Games
that need something this package cannot give them raise one line when the env is made: NLTK word
lists (Wordle, Hangman, WordLadder, WordSearch, ...: TextArena downloads them from GitHub on first
use; offline, install them first with ``python -m nltk.downloader words
averaged_perceptron_tagger_eng``), an OpenRouter key (GuessWho, TwentyQuestions), or a Python that
parses the game's source (Klondike needs Python >= 3.12). :func:`check` tells at config read.
"""

from __future__ import annotations

import difflib
import random
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["TextArenaEnv", "TextArenaGame", "check", "EXPERTS", "PRIVILEGED", "PACKAGE_HINT"]

PACKAGE_HINT = "pip install 'pcsd[textarena]' (textarena==0.7.4)"

_ANSI = re.compile(r"\x1b\[[0-9;]*m")

#: the ``random`` module's functions: bound methods of its hidden global ``Random``
_RANDOM_FUNCS = tuple(
    n for n in dir(random) if getattr(getattr(random, n), "__self__", None) is getattr(random.random, "__self__")
)


def _random_methods(rng: random.Random) -> list[tuple[str, Any]]:
    return [(name, getattr(rng, name)) for name in _RANDOM_FUNCS]


def _with_random(methods: list[tuple[str, Any]], fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn`` with a ``Random``'s methods (:func:`_random_methods`) behind the ``random`` module's
    functions."""
    outer = [(name, getattr(random, name)) for name, _ in methods]
    for name, method in methods:
        setattr(random, name, method)
    try:
        return fn(*args, **kwargs)
    finally:
        for name, function in outer:
            setattr(random, name, function)


def _textarena() -> Any:
    try:
        import textarena
    except ImportError as e:
        raise ImportError(
            f"TextArena games need the 'textarena' package, which is not installed ({e}): {PACKAGE_HINT}"
        ) from None
    return textarena


def _one_line(text: str) -> str:
    """An exception's text on one line (NLTK's LookupError is a framed paragraph)."""
    text = _ANSI.sub("", text)
    m = re.search(r"Resource\s+'?([\w./-]+)'?\s+not found", text)
    if m:
        return (
            f"needs the NLTK data '{m.group(1)}', which is not installed (TextArena downloads it from "
            f"GitHub on first use; install it with: python -m nltk.downloader {m.group(1)})"
        )
    return " ".join(text.split())


# --- experts ---------------------------------------------------------------------------------------


def _guess_the_number(game: Any) -> str:
    """Binary search on the hints the game gave: the middle of the range the hints leave open."""
    lo, hi = game.min_number, game.max_number
    for guess, hint in game.state.game_state["guess_history"]:
        if hint == "higher":
            lo = max(lo, guess + 1)
        else:
            hi = min(hi, guess - 1)
    return f"[{(lo + hi) // 2}]"


def _tower_of_hanoi(game: Any) -> str:
    """The first move of the shortest solution from the current (legal) position: the largest disk
    not yet on its target goes there once every smaller disk is on the third tower; until then the
    smaller disks are the subproblem (target: that third tower)."""
    towers: dict[str, list[int]] = game.state.game_state["towers"]
    where = {disk: name for name, disks in towers.items() for disk in disks}

    def move(disk: int, target: str) -> tuple[str, str] | None:
        while disk > 0 and where[disk] == target:
            disk -= 1
        if disk == 0:
            return None
        source = where[disk]
        spare = next(t for t in towers if t not in (source, target))
        return move(disk - 1, spare) or (source, target)

    step = move(game.num_disks, "C")
    if step is None:
        raise RuntimeError("TowerOfHanoi is already solved: no expert move")
    return f"[{step[0]} {step[1]}]"


#: Experts by the game's class name (so every variant of a game id has it): game -> action text.
EXPERTS: dict[str, Callable[[Any], str]] = {
    "GuessTheNumberEnv": _guess_the_number,
    "TowerOfHanoiEnv": _tower_of_hanoi,
}


# --- privileged text: the game's hidden state ------------------------------------------------------


def _rows(grid: Any) -> str:
    return "\n".join(" ".join(str(c) for c in row) for row in grid)


def _minesweeper(game: Any) -> str | None:
    mines = [f"({r} {c})" for r, row in enumerate(game.grid) for c, v in enumerate(row) if v == -1]
    return f"The mines are at (row col): {', '.join(mines)}." if mines else None  # placed by the first move


def _logic_puzzle(game: Any) -> str:
    out = []
    for table in game.game_board_solution.values():
        for item, marks in table.items():
            out += [f"{item} goes with {who}" for who, mark in marks.items() if mark == "O"]
    return "The solution: " + "; ".join(out) + "."


def _secretary(game: Any) -> str:
    gs = game.state.game_state
    ahead = gs["draws"][gs["current_idx"] + 1 :]
    best = max(gs["draws"])
    return f"The values still to come: {', '.join(f'{v:.4f}' for v in ahead) or 'none'}; the best of all is {best:.4f}."


#: The hidden state of the games that have one, by the game's class name: game -> the privileged
#: text (None: nothing hidden yet).
PRIVILEGED: dict[str, Callable[[Any], str | None]] = {
    "GuessTheNumberEnv": lambda g: f"The secret number is {g.game_number}.",
    "MastermindEnv": lambda g: "The secret code is " + " ".join(map(str, g.state.game_state["secret_code"])) + ".",
    "MinesweeperEnv": _minesweeper,
    "BanditEnv": lambda g: (
        "Win probability of each button: "
        + ", ".join(f"{k} {v:.2f}" for k, v in g.state.game_state["ground_truth"].items())
        + "."
    ),
    "BlackjackEnv": lambda g: "The dealer's hand: " + ", ".join(g.state.game_state["dealer_hand"]) + ".",
    "CrosswordsEnv": lambda g: (
        "The words (row, column, direction): "
        + "; ".join(f"{w} at ({r}, {c}) {d}" for w, (r, c, d) in g.state.game_state["placed_words"].items())
        + "."
    ),
    "LogicPuzzleEnv": _logic_puzzle,
    "SudokuEnv": lambda g: "The solved grid:\n" + _rows(g.full_grid),
    "ThreeCardMonteEnv": lambda g: f"The ball is under cup {g.ball_pos}.",
    "SecretaryEnv": _secretary,
}


# --- opening a game --------------------------------------------------------------------------------


@dataclass(frozen=True)
class TextArenaGame:
    """What :func:`check` learned about a game id."""

    env_id: str
    has_expert: bool
    version: str  #: the textarena package's version


def _unwrap(env: Any, ta: Any) -> Any:
    while isinstance(env, ta.Wrapper):
        env = env.env
    return env


def _player_count_error(ta: Any, env_id: str, kwargs: Mapping[str, Any]) -> str | None:
    """Why the game is not single-player, or ``None`` when it is not a player-count problem: a game
    that cannot start with 1 player but starts with 2..6 is multi-player."""
    for n in range(2, 7):
        try:
            game = _unwrap(ta.make(env_id, **kwargs), ta)
            game.reset(num_players=n, seed=0)
        except Exception:
            continue
        return f"a multi-player game (it starts with {n} players, not 1)"
    return None


def _open(env_id: Any, kwargs: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    """``(ta, wrapped env, game)`` for a single-player game id, reset once with seed 0; one-line
    errors for an unknown id, a multi-player id, or a game that cannot start here."""
    if not isinstance(env_id, str) or not env_id:
        raise TypeError(f"env_id must be a non-empty str (a TextArena game id), got {env_id!r}")
    ta = _textarena()
    from textarena.envs.registration import ENV_REGISTRY

    if env_id not in ENV_REGISTRY:
        near = difflib.get_close_matches(env_id, list(ENV_REGISTRY), n=3)
        hint = (
            f"; did you mean {', '.join(near)}?" if near else " (textarena.envs.registration.ENV_REGISTRY lists them)"
        )
        raise ValueError(f"env_id {env_id!r}: textarena {ta.__version__} has no such game{hint}")
    try:
        env = ta.make(env_id, **kwargs)
        game = _unwrap(env, ta)
    except Exception as e:
        raise ValueError(
            f"env_id {env_id!r}: the TextArena game cannot be made here: {type(e).__name__}: {_one_line(str(e))}"
        ) from None
    why = None
    own = _random_methods(random.Random())  # the caller's `random` stays as it is
    try:
        _with_random(own, game.reset, num_players=1, seed=0)
    except Exception as e:
        why = _with_random(own, _player_count_error, ta, env_id, kwargs)
        if why is None:
            raise ValueError(
                f"env_id {env_id!r}: the TextArena game cannot start here: {type(e).__name__}: {_one_line(str(e))}"
            ) from None
    if why is None and not isinstance(game.state, ta.SinglePlayerState):
        why = f"not a single-player game (its state is a {type(game.state).__name__})"
    if why is not None:
        raise ValueError(
            f"env_id {env_id!r}: {why}; pcsd trains on TextArena's single-player games "
            "(GuessTheNumber-v0, TowerOfHanoi-v0, Sudoku-v0, Minesweeper-v0, ...)"
        )
    return ta, env, game


def check(env_id: str, **kwargs: Any) -> TextArenaGame:
    """Makes and resets the game once (seed 0) and discards it: raises one line (``ImportError``:
    textarena missing; ``ValueError``: an unknown or multi-player id, a game that cannot start here;
    ``TypeError``: a bad argument) where :class:`TextArenaEnv` would. ``kwargs`` go to the game's
    constructor over the id's registered ones (e.g. ``max_number=50``)."""
    ta, _, game = _open(env_id, kwargs)
    return TextArenaGame(env_id, type(game).__name__ in EXPERTS, ta.__version__)


class TextArenaEnv:
    """One TextArena single-player game in pcsd's text-env protocol (see the module docs).

    ``env_id``: a registered game id (``GuessTheNumber-v0``, ``TowerOfHanoi-v0``, ...); ``kwargs``:
    the game constructor's arguments over the id's registered ones. Raises as :func:`check` does.
    ``expert_action()`` is defined only for the games in :data:`EXPERTS`.
    """

    def __init__(self, env_id: str, **kwargs: Any) -> None:
        ta, env, game = _open(env_id, kwargs)
        self.env_id = env_id
        self._ta = ta
        self._env = env  # the id's wrappers: actions go through them
        self._game = game  # the bare game: its raw messages, state and outcome
        self._random = _random_methods(random.Random())  # this env's `random` (seeded by the game's reset)
        self._live = False
        expert = EXPERTS.get(type(game).__name__)
        if expert is not None:
            self.expert_action = lambda: self._expert(expert)
        self._privileged = PRIVILEGED.get(type(game).__name__)

    def __repr__(self) -> str:
        return f"TextArenaEnv({self.env_id!r})"

    def _messages(self) -> list[tuple[int, str, Any]]:
        _, messages = self._game.get_observation()
        return messages

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """A new game (``seed``: TextArena's reset seed; ``None``: this env's own random stream).
        ``options`` must be empty: TextArena's reset takes none."""
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise TypeError(f"seed must be an int or None, got {type(seed).__name__}")
        if options:
            raise ValueError(f"options: TextArena games take no reset options, got {sorted(options)}")
        _with_random(self._random, self._env.reset, num_players=1, seed=seed)
        messages = self._messages()
        prompt_type = self._ta.ObservationType.PROMPT
        task = "\n".join(text for _, text, kind in messages if kind == prompt_type)
        self._live = True
        info = {"task": task, "task_type": self.env_id}
        self._add_privileged(info)
        return self._text(messages), info

    def _add_privileged(self, info: dict[str, Any]) -> None:
        if self._privileged is not None:
            text = self._privileged(self._game)
            if text:
                info["privileged"] = text

    def _text(self, messages: list[tuple[int, str, Any]]) -> str:
        action_type = self._ta.ObservationType.PLAYER_ACTION
        return "\n".join(text for _, text, kind in messages if kind != action_type)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if not isinstance(action, str):
            raise TypeError(f"action must be a str, got {type(action).__name__}")
        if not self._live:
            raise RuntimeError(f"{self.env_id}: step() before reset() or after the game ended; call reset()")
        errors_before = self._game.state.error_count
        done, _ = _with_random(self._random, self._env.step, action)
        obs = self._text(self._messages())
        info: dict[str, Any] = {"task_type": self.env_id}
        self._add_privileged(info)
        if not done:
            info["invalid_move"] = self._game.state.error_count > errors_before
            return obs, 0.0, False, False, info
        self._live = False
        rewards, game_info = self._game.close()
        reward = float((rewards or {}).get(0, 0.0))
        outcome = game_info.get(0, {})
        invalid = bool(outcome.get("invalid_move", False))
        reason = outcome.get("reason")
        if reason:
            obs = f"{obs}\n{reason}" if obs else str(reason)
        info.update(invalid_move=invalid, won=reward >= 1.0 and not invalid, reason=reason)
        return obs, reward, True, False, info

    def _expert(self, expert: Callable[[Any], str]) -> str:
        if not self._live:
            raise RuntimeError(f"{self.env_id}: expert_action() before reset() or after the game ended")
        return expert(self._game)

    def close(self) -> None:
        self._live = False
