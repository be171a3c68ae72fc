"""The evaluation's fixed game lists: ALFWorld splits (sorted), generated procedural games, named
subsets (``count``, ``task_types``, a games file), and the per-game names and seeds."""

from __future__ import annotations

import os
import zlib
from pathlib import Path
from typing import Any, Optional, Sequence

from pcsd.envs.alfworld import CATEGORIES, CATEGORY_ORDER

SPLITS: tuple[str, ...] = ("valid_seen", "valid_unseen", "train", "procedural")
#: seed of the first procedural evaluation game (the trainer's fixed evaluation set uses it too)
PROCEDURAL_EVAL_SEED = 900_000
DEFAULT_SEED = 12345

#: Python text environments: evaluation tasks are the seeds EVAL_SEED_BASE + i, above every seed the
#: trainer trains or warms up on (pcsd.train.textenv)
TEXT_ENV_EVAL_SEED_BASE = 1_000_000_000
TEXT_ENV_EVAL_EPISODES = 128  # when eval.episodes / --episodes is 0

#: method labels of the paper's rows, by weighting rule (GRPO + distillation presets)
RULE_LABELS = {"pcsd": "PCSD", "uniform": "GRPO+OPSD", "sdar": "SDAR", "sdar-norm": "SDAR-norm", "rlsd": "RLSD"}


class EvalError(ValueError):
    """A bad evaluation argument; the message names it and says what was expected."""


# ----------------------------------------------------------------------------- game lists
def _data_root(data_root: Optional[str | os.PathLike[str]] = None) -> Path:
    root = data_root or os.environ.get("ALFWORLD_DATA")
    if not root:
        raise EvalError(
            "ALFWorld splits need ALFWORLD_DATA (the folder holding json_2.1.1/); set it, or use split=procedural"
        )
    return Path(root)


def split_games(split: str, data_root: Optional[str | os.PathLike[str]] = None) -> list[str]:
    """Every ``game.tw-pddl`` of an ALFWorld split, sorted (the fixed order)."""
    if split not in SPLITS or split == "procedural":
        raise EvalError(f"split={split!r} is unknown: expected one of {', '.join(SPLITS)}")
    base = _data_root(data_root) / "json_2.1.1" / split
    games = sorted(str(p) for p in base.glob("*/*/game.tw-pddl"))
    if not games:
        raise EvalError(f"split={split!r}: no game.tw-pddl files under {base}")
    return games


def procedural_eval_games(
    out_dir: str | os.PathLike[str], count: int, seed: int = PROCEDURAL_EVAL_SEED, **knobs: Any
) -> list[str]:
    """``count`` generated games in a fixed list (task types in the paper's column order, in rotation;
    game ``i`` has seed ``seed + i``), written to ``out_dir`` once and reused."""
    from pcsd.envs.procedural import write_games

    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise EvalError(f"count={count!r}: expected a positive int for split=procedural")
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
            raise EvalError(
                f"task type {t!r} is unknown: expected one of {', '.join(CATEGORY_ORDER)} or {', '.join(CATEGORIES)}"
            )
    if not want:
        raise EvalError("task_types is empty: name at least one task type")
    return want


def select_games(games: Sequence[str], *, count: int = 0, task_types: Optional[Sequence[str]] = None) -> list[str]:
    """A named subset of a fixed list: the games of ``task_types`` (paper or ALFWorld names), then
    the first ``count`` of them (0 = all). Order is kept."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise EvalError(f"count={count!r}: expected a non-negative int (0 = every game)")
    want = _category_filter(task_types)
    out = [g for g in games if want is None or game_task_type(g) in want]
    if count:
        out = out[:count]
    if not out:
        raise EvalError(f"no games left after the filter (task_types={task_types}, count={count})")
    return out


def read_games_file(path: str | os.PathLike[str], data_root: Optional[str | os.PathLike[str]] = None) -> list[str]:
    """Game paths, one a line (``#`` comments, blank lines skipped); a relative path is looked up
    beside the file, then under ``$ALFWORLD_DATA/json_2.1.1``."""
    p = Path(path)
    if not p.is_file():
        raise EvalError(f"games_file={str(p)!r}: no such file")
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
            raise EvalError(f"games_file={str(p)!r} line {n}: no such game file {line!r}")
        out.append(str(hit))
    if not out:
        raise EvalError(f"games_file={str(p)!r} lists no games")
    return out


def text_env_eval_seeds(count: int = 0) -> list[int]:
    """The evaluation tasks of a Python text environment: ``count`` (0: 128) fixed reset seeds,
    ``TEXT_ENV_EVAL_SEED_BASE + i``; the trainer evaluates on the same ones."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise EvalError(f"count={count!r}: expected a non-negative int (0 = {TEXT_ENV_EVAL_EPISODES})")
    return [TEXT_ENV_EVAL_SEED_BASE + i for i in range(count or TEXT_ENV_EVAL_EPISODES)]


def game_name(path: str) -> str:
    """A game's stable name: its path below the split folder (``<task folder>/<trial>``) for
    ALFWorld layouts, else its file name."""
    p = Path(path)
    if p.name == "game.tw-pddl":
        return f"{p.parent.parent.name}/{p.parent.name}"
    return p.name


def game_seed(path: str, seed: int) -> int:
    return seed + zlib.crc32(game_name(path).encode())
