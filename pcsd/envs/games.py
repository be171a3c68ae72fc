"""ALFWorld's game files as task lists: the splits (sorted), generated procedural games, named
subsets (``count``, ``task_types``, a games file), the per-game names and seeds, and the two ways an
evaluation draws its episodes from a list (the ALFWorld kind's evaluation tasks,
:mod:`pcsd.envs.kinds.alfworld`; ``python -m pcsd.eval`` re-exports them from :mod:`pcsd.eval`).

Two protocols (``docs/eval-protocol.md``):

* ``full`` (the default of ``python -m pcsd.eval``): every game of the split once, sorted order,
  fixed seeds (:func:`split_games`). ``episodes=N`` keeps a stratified subset
  (:func:`stratified_subset`: every category keeps its share) instead of the first N sorted games.
* ``paper``: 128 episodes drawn the way the GiGPO / verl-agent setup (and its fork ZJU-REAL/SDAR,
  whose scripts the paper follows) draws its validation episodes. There, validation environment
  ``i`` (``i = 0..127``) is a TextWorld batch env of one game over the whole split, seeded with
  ``env.seed + 1000 + i``; seeding shuffles the split's game list with
  ``numpy.random.RandomState(seed)`` and TextWorld's ``shuffled_cycle`` then yields that order, and
  a new shuffle (same generator) after each full pass. Every validation run resets each
  environment once, so validation ``v`` (0 = before training) plays element ``v`` of that stream.
  Environments are independent, so the 128 episodes are drawn with replacement.
  :func:`paper_episodes` reproduces this draw exactly for a given game list order.

Both report Overall with a 95 % Wilson score interval (:func:`pcsd.envs.tables.wilson_interval`).
"""

from __future__ import annotations

import math
import os
import random
import zlib
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

from pcsd.envs.alfworld import CATEGORIES, CATEGORY_ORDER
from pcsd.envs.kind import TaskError

__all__ = [
    "DEFAULT_SEED",
    "PAPER_EPISODES",
    "PROCEDURAL_EVAL_SEED",
    "PROTOCOLS",
    "SPLITS",
    "TaskError",
    "VALIDATION_SEED_OFFSET",
    "game_name",
    "game_seed",
    "game_task_type",
    "paper_episodes",
    "procedural_eval_games",
    "protocol_games",
    "read_games_file",
    "select_games",
    "split_games",
    "stratified_subset",
]

SPLITS: tuple[str, ...] = ("valid_seen", "valid_unseen", "train", "procedural")
#: seed of the first procedural evaluation game (the trainer's fixed evaluation set uses it too)
PROCEDURAL_EVAL_SEED = 900_000
DEFAULT_SEED = 12345

PROTOCOLS = ("full", "paper")
PAPER_EPISODES = 128  # data.val_batch_size in verl-agent's / SDAR's ALFWorld scripts
VALIDATION_SEED_OFFSET = 1000  # verl-agent seeds its validation envs with env.seed + 1000 (+ i)


# ----------------------------------------------------------------------------- game lists
def _data_root(data_root: Optional[str | os.PathLike[str]] = None) -> Path:
    root = data_root or os.environ.get("ALFWORLD_DATA")
    if not root:
        raise TaskError(
            "ALFWorld splits need ALFWORLD_DATA (the folder holding json_2.1.1/); set it, or use split=procedural"
        )
    return Path(root)


def split_games(split: str, data_root: Optional[str | os.PathLike[str]] = None) -> list[str]:
    """Every ``game.tw-pddl`` of an ALFWorld split, sorted (the fixed order)."""
    if split not in SPLITS or split == "procedural":
        raise TaskError(f"split={split!r} is unknown: expected one of {', '.join(SPLITS)}")
    base = _data_root(data_root) / "json_2.1.1" / split
    games = sorted(str(p) for p in base.glob("*/*/game.tw-pddl"))
    if not games:
        raise TaskError(f"split={split!r}: no game.tw-pddl files under {base}")
    return games


def procedural_eval_games(
    out_dir: str | os.PathLike[str], count: int, seed: int = PROCEDURAL_EVAL_SEED, **knobs: Any
) -> list[str]:
    """``count`` generated games in a fixed list (task types in the paper's column order, in rotation;
    game ``i`` has seed ``seed + i``), written to ``out_dir`` once and reused."""
    from pcsd.envs.procedural import write_games

    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise TaskError(f"count={count!r}: expected a positive int for split=procedural")
    wanted = knobs.pop("task_types", None)  # a subset keeps the column order
    task_types = [tt for tt in CATEGORIES if wanted is None or tt in wanted]
    return write_games(out_dir, count, seed, task_types, **knobs)


def game_task_type(path: str | os.PathLike[str]) -> str:
    """The task type of a game file: from the ALFWorld folder name (``<task_type>-...``) or the
    procedural file name (``NNNNN-<task_type>.tw-pddl``); otherwise read from the game."""
    p = Path(path)
    for name in (p.parent.parent.name, p.stem.split("-", 1)[-1]):
        tt = name.split("-", 1)[0] if name not in CATEGORIES else name
        if tt in CATEGORIES:
            return tt
    from pcsd.envs.alfworld import AlfworldGame

    return AlfworldGame.from_file(p).task_type


def _category_filter(task_types: Optional[Sequence[str]]) -> Optional[set[str]]:
    if task_types is None:
        return None
    by_name = {c.lower(): tt for tt, c in CATEGORIES.items()}
    want = set()
    for t in task_types:
        t = t.strip()
        if t in CATEGORIES:
            want.add(t)
        elif t.lower() in by_name:
            want.add(by_name[t.lower()])
        else:
            raise TaskError(
                f"task type {t!r} is unknown: expected one of {', '.join(CATEGORY_ORDER)} or {', '.join(CATEGORIES)}"
            )
    if not want:
        raise TaskError("task_types is empty: name at least one task type")
    return want


def select_games(games: Sequence[str], *, count: int = 0, task_types: Optional[Sequence[str]] = None) -> list[str]:
    """A named subset of a fixed list: the games of ``task_types`` (paper or ALFWorld names), then
    the first ``count`` of them (0 = all). Order is kept."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise TaskError(f"count={count!r}: expected a non-negative int (0 = every game)")
    want = _category_filter(task_types)
    out = [g for g in games if want is None or game_task_type(g) in want]
    if count:
        out = out[:count]
    if not out:
        raise TaskError(f"no games left after the filter (task_types={task_types}, count={count})")
    return out


def read_games_file(path: str | os.PathLike[str], data_root: Optional[str | os.PathLike[str]] = None) -> list[str]:
    """Game paths, one a line (``#`` comments, blank lines skipped); a relative path is looked up
    beside the file, then under ``$ALFWORLD_DATA/json_2.1.1``."""
    p = Path(path)
    if not p.is_file():
        raise TaskError(f"games_file={str(p)!r}: no such file")
    roots = [p.parent]
    root = data_root or os.environ.get("ALFWORLD_DATA")
    if root:
        roots.append(Path(root) / "json_2.1.1")
    out = []
    for n, line in enumerate(p.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        g = Path(line)
        cands = [g] if g.is_absolute() else [r / g for r in roots]
        hit = next((c for c in cands if c.is_file()), None)
        if hit is None:
            raise TaskError(f"games_file={str(p)!r} line {n}: no such game file {line!r}")
        out.append(str(hit))
    if not out:
        raise TaskError(f"games_file={str(p)!r} lists no games")
    return out


def game_name(path: str) -> str:
    """A game's stable name: its path below the split folder (``<task folder>/<trial>``) for
    ALFWorld layouts, else its file name."""
    p = Path(path)
    if p.name == "game.tw-pddl":
        return f"{p.parent.parent.name}/{p.parent.name}"
    return p.name


def game_seed(path: str, seed: int) -> int:
    return seed + zlib.crc32(game_name(path).encode())


# ----------------------------------------------------------------------------- the protocols
def _shuffled_cycle(elements: list, rng) -> Iterator:
    """TextWorld's ``textworld.gym.envs.utils.shuffled_cycle``: the elements in order, then
    reshuffled with ``rng`` before every further pass."""
    yield from elements
    while True:
        rng.shuffle(elements)
        yield from elements


def paper_episodes(
    games: Sequence[str], episodes: int = PAPER_EPISODES, seed: int = 0, validation_index: int = 0
) -> list[str]:
    """The ``episodes`` games verl-agent's validation run number ``validation_index`` plays, for
    ``env.seed = seed`` and the split's game list ``games`` (in the order its loader lists them).

    Environment ``i`` is seeded with ``seed + 1000 + i``: ``RandomState(s).shuffle`` of a copy of
    the list, then :func:`_shuffled_cycle` with the same generator; validation ``v`` takes the
    ``v``-th game of that stream."""
    import numpy as np

    if isinstance(episodes, bool) or not isinstance(episodes, int) or episodes < 1:
        raise TaskError(f"episodes={episodes!r}: expected a positive int")
    if isinstance(validation_index, bool) or not isinstance(validation_index, int) or validation_index < 0:
        raise TaskError(f"validation_index={validation_index!r}: expected a non-negative int")
    if not games:
        raise TaskError("games is empty: nothing to draw from")
    out = []
    for i in range(episodes):
        rng = np.random.RandomState(seed + VALIDATION_SEED_OFFSET + i)
        order = list(games)
        rng.shuffle(order)  # TextworldBatchGymEnv.seed
        stream = _shuffled_cycle(order, rng)
        for _ in range(validation_index):
            next(stream)
        out.append(next(stream))
    return out


def stratified_subset(games: Sequence[str], count: int, seed: int = 0) -> list[str]:
    """``count`` of ``games`` with every task type keeping its share (largest remainders), the games
    of a type picked with ``random.Random(seed)``; the list's order is kept. ``count`` >= the list's
    length returns it whole."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise TaskError(f"count={count!r}: expected a positive int")
    if count >= len(games):
        return list(games)
    by_type: dict[str, list[int]] = {}
    for i, g in enumerate(games):
        by_type.setdefault(game_task_type(g), []).append(i)
    quota = {t: count * len(ix) / len(games) for t, ix in by_type.items()}
    take = {t: int(math.floor(q)) for t, q in quota.items()}
    left = count - sum(take.values())
    for t in sorted(quota, key=lambda t: (-(quota[t] - take[t]), t))[:left]:
        take[t] += 1
    rng = random.Random(seed)
    keep: set[int] = set()
    for t in sorted(by_type):
        keep.update(rng.sample(by_type[t], take[t]))
    return [g for i, g in enumerate(games) if i in keep]


def protocol_games(
    games: Sequence[str], protocol: str, episodes: int = 0, seed: int = 0, validation_index: int = 0
) -> list[str]:
    """The episodes of one evaluation: ``full`` every game (or a stratified subset of ``episodes``),
    ``paper`` ``episodes`` (default 128) drawn as :func:`paper_episodes` does."""
    if protocol == "full":
        return stratified_subset(games, episodes, seed) if episodes else list(games)
    if protocol == "paper":
        return paper_episodes(games, episodes or PAPER_EPISODES, seed, validation_index)
    raise TaskError(f"protocol={protocol!r} is unknown: expected one of {', '.join(PROTOCOLS)}")
