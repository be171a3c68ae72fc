"""ALFWorld (``env.name=alfworld``, the default kind) and the native pool's test game (``dummy``).

ALFWorld runs on the native engine (:mod:`pcsd.envs.alfworld`) in the native pool. Its tasks are
game files: generated procedural games (``env.source=procedural``: training games generated when a
step plays them, :class:`pcsd.envs.procedural.ProceduralGames`; the evaluation list and the
warm-up's games written once under the run's ``games/``), or the dataset's splits
(``env.source=files``: ``env.split`` for training, ``eval.split`` for the evaluations, from
``$ALFWORLD_DATA``). An evaluation plays its list under ``eval.protocol`` (:mod:`pcsd.envs.games`);
the warm-up imitates :class:`pcsd.envs.experts.ObservationExpert` (and, with
``optim.sft_teacher_demos=skills``, the expert that searches where the teacher's skills say).
Success is ``won``; the reward ``algo.success_reward`` on a win; an engine error stops the run (it
is a bug, not the env's fault). Results go in Table 1's category columns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Callable, Optional

from pcsd.envs.alfworld import CATEGORIES, CATEGORY_ORDER
from pcsd.envs.kind import EnvKind, EnvRun, EvalPlan, Key, NativePools, Pools, TaskError, Warmup

__all__ = ["ALFWORLD", "DUMMY", "AlfworldKind", "DummyKind", "procedural_knobs"]

#: seeds of the generated game lists (training, evaluation, warm-up); ``python -m pcsd.eval`` uses the same
TRAIN_GAMES_SEED, EVAL_GAMES_SEED, SFT_GAMES_SEED = 1000, 900_000, 500_000


def procedural_knobs(cfg: Any) -> dict[str, Any]:
    """The generator's knobs set in the config (``env.receptacles``, ``env.distractors``,
    ``env.task_types``, ``env.rooms``, ``env.usual_place``) as keyword arguments of
    :func:`pcsd.envs.procedural.write_games`."""
    kw: dict[str, Any] = {k: int(cfg.env[k]) for k in ("receptacles", "distractors") if cfg.env.get(k) is not None}
    if cfg.env.get("usual_place"):
        kw["usual_place"] = float(cfg.env.usual_place)
    if cfg.env.get("task_types") is not None:
        kw["task_types"] = tuple(cfg.env.task_types)
    if cfg.env.get("rooms") is not None:
        kw["rooms"] = tuple(cfg.env.rooms)
    return kw


class AlfworldKind(EnvKind):
    name = "alfworld"
    title = "ALFWorld"
    description = "the native ALFWorld engine (procedural games or the dataset's game files)"
    prompt = "alfworld"
    errors_end_episode = False
    table = "table1"
    category_names = CATEGORIES  # Table 1's columns: Pick, Look, Clean, Heat, Cool, Pick2
    categories = CATEGORY_ORDER
    eval_splits = ("valid_seen", "valid_unseen", "train", "procedural")
    keys = (
        Key(
            "source",
            str,
            "procedural",
            "procedural (generated games) | files ($ALFWORLD_DATA)",
            ("procedural", "files"),
        ),
        Key("split", str, "train", "the training split of env.source=files", ("train", "valid_seen", "valid_unseen")),
        Key("receptacles", Optional[int], None, "procedural games: total receptacles, at least the room's minimum"),
        Key("distractors", Optional[int], None, "procedural games: objects besides the task's own"),
        Key("task_types", Optional[list[str]], None, "procedural task types (null: all six, in rotation)"),
        Key("rooms", Optional[list[str]], None, "procedural rooms (null: any room the task type allows)"),
        Key("usual_place", float, 0.0, "probability that a procedural task object starts in its usual place"),
        Key("split", str, "valid_seen", "the evaluations' split", ("valid_seen", "valid_unseen", "train"), "eval"),
    )

    # ---- config
    def check(self, cfg: Any) -> Optional[str]:
        from pcsd.envs.procedural import ROOMS, TASK_TYPES, task_rooms

        for key, valid in (("task_types", TASK_TYPES), ("rooms", ROOMS)):
            vals = cfg.env.get(key)
            if vals is not None:
                if not len(vals):
                    return f"env.{key} is empty; give null (all) or some of {', '.join(valid)}"
                for v in vals:
                    if v not in valid:
                        return f"env.{key} has {v!r}, not valid; choose from {', '.join(valid)}"
        if cfg.env.rooms is not None:
            for tt in cfg.env.task_types or TASK_TYPES:
                if not set(task_rooms(tt)) & set(cfg.env.rooms):
                    return (
                        f"env.rooms={list(cfg.env.rooms)} has no room for task type {tt} "
                        f"(it can be set in {', '.join(task_rooms(tt))}); add one or set env.task_types"
                    )
        if not 0 <= cfg.env.usual_place <= 1:
            return f"env.usual_place must be a probability in [0, 1], got {cfg.env.usual_place}"
        if cfg.eval.protocol == "paper" and cfg.eval.split == "train":
            return "eval.protocol=paper draws validation episodes from valid_seen or valid_unseen, not eval.split=train"
        return None

    def pools(self, options: Optional[Mapping[str, Any]] = None) -> Pools:
        if options:
            raise ValueError(
                f"{next(iter(options))}: env kind 'alfworld' takes no pool options (got {sorted(options)})"
            )
        return NativePools(self)

    def open(self, cfg: Any, run_dir: Path, *, main: bool, barrier: Callable[[], None]) -> EnvRun:
        return AlfworldRun(self, cfg, run_dir, main, barrier)

    # ---- results
    def result_fields(self, games: Sequence[Any]) -> dict[str, Any]:
        counts = {c: 0 for c in CATEGORY_ORDER}
        won = {c: 0 for c in CATEGORY_ORDER}
        for g in games:
            counts[g.category] += 1
            won[g.category] += int(g.won)
        per = {c: (100.0 * won[c] / counts[c] if counts[c] else None) for c in CATEGORY_ORDER}
        return dict(per_category=per, counts=counts)

    def describe_result(self, result: Mapping[str, Any]) -> str:
        return ""

    def summary_fields(self, result: Mapping[str, Any], when: str) -> dict[str, Any]:
        return {}

    def step_fields(self, batch: Any) -> dict[str, Any]:
        return {}

    # ---- python -m pcsd.eval
    def add_eval_arguments(self, parser: Any) -> None:
        g = parser.add_argument_group("ALFWorld (--split valid_seen, valid_unseen, train, procedural)")
        g.add_argument("--task-types", default=None, help="comma-separated categories, e.g. Pick,Heat")
        g.add_argument("--games-file", default=None, help="a file listing game paths, one a line")
        g.add_argument(
            "--procedural-games",
            type=int,
            default=0,
            help="split=procedural: size of the fixed generated list (default: the run's "
            "eval.episodes, else 48); with a tiny-preset run the list is the trainer's own",
        )
        g.add_argument("--games-dir", default=None, help="where split=procedural writes its games")
        g.add_argument(
            "--distractors",
            type=int,
            default=None,
            help="split=procedural: distractor objects (default: the run's env.distractors, else drawn)",
        )
        g.add_argument(
            "--receptacles",
            type=int,
            default=None,
            help="split=procedural: receptacles per game (default: the run's env.receptacles, else drawn)",
        )

    def check_eval_arguments(self, splits: Sequence[str], args: Any) -> None:
        if getattr(args, "procedural_games", 0) < 0:
            raise TaskError(f"procedural_games={args.procedural_games}: expected >= 0")
        if args.games_file and len(splits) > 1:
            raise TaskError("games_file names one list of games: give a single --split (its row label)")
        if (args.games_file or args.task_types) and not any(s in self.eval_splits for s in splits):
            raise TaskError(
                f"games_file / task_types select ALFWorld games; --split names none ({', '.join(self.eval_splits)})"
            )

    def eval_plan(
        self, split: str, args: Any, run_dir: Optional[Path], run_cfg: Mapping[str, Any], out_dir: Path
    ) -> EvalPlan:
        from pcsd.envs.games import (
            procedural_eval_games,
            protocol_games,
            read_games_file,
            select_games,
            split_games,
        )

        if args.games_file:
            games = read_games_file(args.games_file)
        elif split == "procedural":
            # defaults from the run: the trainer's own evaluation list (its env.receptacles / env.distractors /
            # env.task_types / env.rooms)
            run_env = run_cfg.get("env", {}) or {}
            knobs: dict[str, Any] = {}
            for k in ("receptacles", "distractors"):
                v = getattr(args, k) if getattr(args, k) is not None else run_env.get(k)
                if v is not None:
                    knobs[k] = int(v)
            for k in ("task_types", "rooms"):  # the run's procedural task types and rooms
                if run_env.get(k) is not None:
                    knobs[k] = list(run_env[k])
            n = args.procedural_games or run_cfg.get("eval", {}).get("episodes") or 48
            games = procedural_eval_games(Path(args.games_dir) if args.games_dir else out_dir / "games", n, **knobs)
        else:
            games = split_games(split)
        tts = args.task_types.split(",") if args.task_types else None
        games = select_games(games, count=args.count, task_types=tts)
        games = protocol_games(
            games, args.protocol, args.episodes, seed=args.draw_seed, validation_index=args.validation_index
        )
        return EvalPlan(tasks=games, pools=NativePools(self), split=split)


class AlfworldRun(EnvRun):
    """ALFWorld's side of a training run."""

    def __init__(self, kind: AlfworldKind, cfg: Any, run_dir: Path, main: bool, barrier: Callable[[], None]) -> None:
        from pcsd.envs.games import split_games
        from pcsd.envs.procedural import ProceduralGames, write_games

        super().__init__(kind, cfg)
        self.run_dir, self.main = run_dir, main
        self.knobs = procedural_knobs(cfg)
        self._pools = NativePools(kind)
        if cfg.env.source == "procedural":
            # generated when played (pcsd.envs.procedural.ProceduralGames): no files, any length
            pool_n = max(64, cfg.rollout.tasks_per_step * max(cfg.optim.steps, 1))
            self.train_tasks = ProceduralGames(pool_n, TRAIN_GAMES_SEED, **self.knobs)
            # protocol full: eval.episodes generated games, each once; paper: 128 draws from 48 games
            n_pool = (cfg.eval.episodes or 48) if cfg.eval.protocol == "full" else 48
            out = run_dir / "games" / "eval"
            if main:  # rank 0 writes the files, the others read the same paths
                write_games(out, n_pool, EVAL_GAMES_SEED, **self.knobs)
            barrier()
            self.eval_pool: list[str] = write_games(out, n_pool, EVAL_GAMES_SEED, **self.knobs)
            self.split = "procedural"
        else:
            self.train_tasks = split_games(cfg.env.split)
            self.eval_pool = split_games(cfg.eval.split)
            self.split = str(cfg.eval.split)

    @property
    def train_pools(self) -> Pools:
        return self._pools

    @property
    def eval_pools(self) -> Pools:
        return self._pools

    def eval_tasks(self, index: int) -> list[Any]:
        """``full``: every game of the pool (``eval.episodes``: a stratified subset of a split);
        ``paper``: the draw verl-agent's validation ``index`` makes with ``env.seed = run.seed``."""
        from pcsd.envs.games import protocol_games

        cfg = self.cfg
        episodes = cfg.eval.episodes if (cfg.eval.protocol == "paper" or cfg.env.source != "procedural") else 0
        return protocol_games(self.eval_pool, cfg.eval.protocol, episodes, seed=cfg.run.seed, validation_index=index)

    def warmup(self, count: int, *, skills: Any) -> Warmup:
        from pcsd.envs.experts import expert_episodes, skill_search_first
        from pcsd.envs.procedural import write_games

        cfg = self.cfg
        games = write_games(self.run_dir / "games" / "sft", count, SFT_GAMES_SEED, **self.knobs)
        out = Warmup(expert_episodes(games, cfg.env.max_steps, cfg.optim.sft_navigation))
        if cfg.optim.sft_teacher_demos == "skills":  # the expert that follows the teacher's skills
            out.teacher_episodes = expert_episodes(
                games, cfg.env.max_steps, cfg.optim.sft_navigation, skill_search_first(skills)
            )
            out.summary["sft_skill_expert_success"] = (
                100.0 * sum(ep.won for ep in out.teacher_episodes) / len(out.teacher_episodes)
            )
        return out


def dummy_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The test game's pool options (``episode_len``, ``busy_iters``, ``panic_at_step``), checked."""
    from pcsd.envs.pool import ENV_KINDS

    known = ENV_KINDS["dummy"].options
    for k, v in options.items():
        if k not in known:
            raise ValueError(f"{k}: not an option of env kind 'dummy' (its options: {', '.join(sorted(known))})")
        if not known[k].check(v):
            raise ValueError(f"{k}: expected {known[k].expected}, got {v!r}")
    return dict(options)


class DummyKind(EnvKind):
    name = "dummy"
    title = "the test game"
    description = "the native pool's deterministic test game"
    prompt = "alfworld"
    configurable = False
    errors_end_episode = False

    def pools(self, options: Optional[Mapping[str, Any]] = None) -> Pools:
        return NativePools(self, per_group=None, **dummy_options(options or {}))


ALFWORLD = AlfworldKind()
DUMMY = DummyKind()
