"""Evaluation: success of a model on an env kind's evaluation tasks, in the kind's table (ALFWorld:
success per category and Overall, in the layout of the paper's Table 1).

:mod:`pcsd.eval.games` gives the fixed game lists (splits, procedural games, named subsets, seeds),
:mod:`pcsd.eval.run` plays them and renders the table (:func:`evaluate` is also what the trainer
calls before and after RL), :mod:`pcsd.eval.cli` is ``python -m pcsd.eval`` / ``pcsd-eval``.
Evaluation imports the rollout, env, text and model layers; never :mod:`pcsd.train`.
"""

from pcsd.envs import registry
from pcsd.eval.cli import main, resolve_model
from pcsd.eval.games import (
    SPLITS,
    EvalError,
    game_name,
    game_seed,
    game_task_type,
    procedural_eval_games,
    read_games_file,
    select_games,
    split_games,
)
from pcsd.eval.run import EvalResult, GameResult, evaluate, play_games, render_table

#: the default env kind's table columns (ALFWorld's task type -> Table 1's column, and their order)
CATEGORIES: dict[str, str] = dict(registry.default().category_names)
CATEGORY_ORDER: tuple[str, ...] = registry.default().categories

__all__ = [
    "CATEGORIES",
    "CATEGORY_ORDER",
    "EvalError",
    "EvalResult",
    "GameResult",
    "SPLITS",
    "evaluate",
    "game_name",
    "game_seed",
    "game_task_type",
    "main",
    "play_games",
    "procedural_eval_games",
    "read_games_file",
    "render_table",
    "resolve_model",
    "select_games",
    "split_games",
]
