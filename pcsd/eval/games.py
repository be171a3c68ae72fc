"""The evaluation's fixed game lists and their names and seeds (ALFWorld's live with its kind, in
:mod:`pcsd.envs.games`; re-exported here), and the method labels of the paper's rows."""

from __future__ import annotations

from pcsd.envs.games import (
    DEFAULT_SEED,
    PROCEDURAL_EVAL_SEED,
    SPLITS,
    game_name,
    game_seed,
    game_task_type,
    procedural_eval_games,
    read_games_file,
    select_games,
    split_games,
)
from pcsd.envs.kind import TaskError

__all__ = [
    "DEFAULT_SEED",
    "EvalError",
    "PROCEDURAL_EVAL_SEED",
    "RULE_LABELS",
    "SPLITS",
    "game_name",
    "game_seed",
    "game_task_type",
    "procedural_eval_games",
    "read_games_file",
    "select_games",
    "split_games",
]

#: a bad evaluation argument; the message names it and says what was expected
EvalError = TaskError

#: method labels of the paper's rows, by weighting rule (GRPO + distillation presets)
RULE_LABELS = {"pcsd": "PCSD", "uniform": "GRPO+OPSD", "sdar": "SDAR", "sdar-norm": "SDAR-norm", "rlsd": "RLSD"}
