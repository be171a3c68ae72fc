"""What an environment kind is: one object that owns everything that differs between the
environments pcsd trains on (after envpool's ``EnvSpec``: the trainer and the evaluation read the
kind, never the env's name).

A kind (:class:`EnvKind`, one subclass per kind in :mod:`pcsd.envs.kinds`, registered by its
``env.name`` in :mod:`pcsd.envs.registry`) owns:

* its **config keys** (:attr:`EnvKind.keys`: the ``env.*`` keys only it reads, their types,
  defaults and choices; the trainer's schema is the common keys plus every kind's) and its
  **config checks** (:meth:`EnvKind.check`, one line naming the key);
* its **prompt family** (:attr:`EnvKind.prompt`: the ``pcsd.text`` family that renders its
  prompts) and **template** (:meth:`EnvKind.template`);
* what an **episode** means: :attr:`EnvKind.errors_end_episode`, :attr:`EnvKind.env_reward`,
  :attr:`EnvKind.task_score`;
* its **pools** (:class:`Pools`: the typed options of one phase's pools, built once; every pool is
  a :class:`Pool`, the vector-env interface the native :class:`pcsd.envs.pool.EnvPool` and the
  worker processes' :class:`pcsd.envs.pypool.PythonEnvPool` both implement, returning
  :class:`pcsd.envs.pool.StepBatch`);
* a **training run's tasks** (:meth:`EnvKind.open` gives an :class:`EnvRun`: the training tasks and
  each RL step's draw, the evaluation tasks, the warm-up's expert episodes, the pools of training
  and evaluation);
* its **evaluation**: the ``python -m pcsd.eval`` splits it plays and their options
  (:meth:`EnvKind.add_eval_arguments`, :meth:`EnvKind.eval_plan`), the figures of a result
  (:meth:`EnvKind.result_fields`: success per category, Score/Acc, mean reward) and the table they
  go in (:attr:`EnvKind.table`, :mod:`pcsd.envs.tables`).

Adding a kind is one module under :mod:`pcsd.envs.kinds` (a subclass of :class:`EnvKind`, and of
:class:`EnvRun` when it trains) plus its line in :data:`pcsd.envs.kinds.BUILTIN`.

Every pool's ``StepBatch.obs`` is the env's current observation without any history: what a
prompt shows as "the current observation", and the per-env anchor an estimator can group steps by.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol, runtime_checkable

if TYPE_CHECKING:
    from pcsd.envs.experts import ExpertEpisode
    from pcsd.envs.pool import StepBatch
    from pcsd.text.prompts import EnvName

__all__ = [
    "EnvFailure",
    "EnvKind",
    "EnvRun",
    "EvalPlan",
    "Key",
    "NativePools",
    "Pool",
    "Pools",
    "TaskError",
    "Warmup",
]


class TaskError(ValueError):
    """A bad task list or evaluation argument; the message names it and says what was expected."""


class EnvFailure(RuntimeError):
    """The environment itself failed where a run cannot go on (every env of a batch failed at
    reset, a native engine's error): one line naming the env and its first error."""


@dataclass(frozen=True)
class Key:
    """One config key a kind owns: ``env.<name>`` (or the dotted ``where``), its type (as the
    schema declares it), default and the values it may take (``choices``)."""

    name: str
    type: Any
    default: Any
    help: str = ""
    choices: Optional[tuple[Any, ...]] = None
    where: str = "env"  #: the config group (``env``, or ``eval`` for ``eval.split``)

    @property
    def dotted(self) -> str:
        return f"{self.where}.{self.name}"


@runtime_checkable
class Pool(Protocol):
    """The batched vector-env interface of every pool (the native pool, the Python envs' pool):
    env ``i`` plays task ``i // group_size``; :meth:`reset` / :meth:`step` answer one
    :class:`pcsd.envs.pool.StepBatch` row per env id, in the ids' order; one env's fault is that
    row's ``error``, never the batch's."""

    @property
    def num_envs(self) -> int: ...

    @property
    def group_size(self) -> int: ...

    def reset(self, env_ids: Optional[Iterable[int]] = None) -> StepBatch: ...

    def step(self, actions: Sequence[str], env_ids: Optional[Iterable[int]] = None) -> StepBatch: ...

    def task_of(self, env_id: int) -> tuple[str, str]: ...

    def close(self) -> None: ...


class Pools:
    """The pools of one phase of a run (training, or evaluation) for one kind: the kind's options
    typed and fixed once (a shop, worker processes, ...); :meth:`make` lays a pool over a task
    list. Subclasses: :class:`NativePools` (the native kinds), :class:`pcsd.envs.kinds.text.PythonPools`."""

    def __init__(self, kind: EnvKind) -> None:
        self.kind = kind

    def make(
        self, num_envs: int, group_size: int, tasks: Sequence[Any] | int, *, max_steps: int, num_threads: int, seed: int
    ) -> Pool:
        """A pool of ``num_envs`` envs, env ``i`` playing ``tasks[i // group_size]`` (game files,
        goal indices, reset seeds; a count of groups for a kind without tasks)."""
        raise NotImplementedError

    def describe(self) -> str:
        """What the evaluation rows call these envs (the kind's name by default)."""
        return self.kind.name


class NativePools(Pools):
    """The native pool (:class:`pcsd.envs.pool.EnvPool`) of a native kind, the one builder of
    ALFWorld's, WebShop's and the test game's pools: the tasks go to the pool as its ``task_arg``
    (``games``: game files; ``goals``: goal indices of a loaded shop), one per group; ``per_group``
    says what a task is in the message for a count of groups (None: a count of groups is taken, the
    test game's tasks); ``options`` are the pool's keyword arguments of the kind (a loaded shop, the
    test game's knobs), checked by the kind before."""

    def __init__(
        self, kind: EnvKind, task_arg: str = "games", per_group: Optional[str] = "one game", **options: Any
    ) -> None:
        super().__init__(kind)
        self.task_arg, self.per_group, self.options = task_arg, per_group, options

    def make(
        self, num_envs: int, group_size: int, tasks: Sequence[Any] | int, *, max_steps: int, num_threads: int, seed: int
    ) -> Pool:
        from pcsd.envs.pool import EnvPool

        if isinstance(tasks, int) and self.per_group is not None:
            raise ValueError(f"games: env kind {self.kind.name!r} needs {self.per_group} per group, got a count")
        task_list = None if isinstance(tasks, int) else list(tasks)
        tasks_kw: dict[str, Any] = {self.task_arg: task_list}
        return EnvPool(
            self.kind.name,
            num_envs,
            group_size=group_size,
            max_steps=max_steps,
            num_threads=num_threads,
            seed=seed,
            **tasks_kw,
            **self.options,
        )


@dataclass
class Warmup:
    """The warm-up's expert episodes of a run: ``episodes`` (the agent's view of every step, in the
    form :mod:`pcsd.text.formats` renders for the kind's prompt family), ``teacher_episodes`` (an
    expert that reads the teacher's skills, for ``optim.sft_teacher_demos=skills``) and what the
    summary records about them."""

    episodes: list[ExpertEpisode] = field(default_factory=list)
    teacher_episodes: Optional[list[ExpertEpisode]] = None
    summary: dict[str, Any] = field(default_factory=dict)


@dataclass
class EvalPlan:
    """What ``python -m pcsd.eval`` plays for one ``--split``: the tasks, the pools, the rows'
    split name, the prompt template (None: the family's own), and the budgets a model that did not
    train on this kind gets (``max_steps``, ``max_prompt_tokens``, ``max_response_tokens``)."""

    tasks: list[Any]
    pools: Pools
    split: str
    template: Optional[str] = None
    max_steps: int = 50
    max_prompt_tokens: int = 2048
    max_response_tokens: int = 512


class EnvKind:
    """One kind of environment (see the module docs). Class attributes describe it; the methods
    have the behaviour of a kind with nothing special, which subclasses override."""

    #: ``env.name``
    name: str = ""
    #: what messages and docs call it (``ALFWorld``)
    title: str = ""
    description: str = ""
    #: the prompt family of :mod:`pcsd.text` (``alfworld``, ``webshop`` or ``text``)
    prompt: EnvName = "text"
    #: Python envs in worker processes (:mod:`pcsd.envs.pypool`), the others native
    python: bool = False
    #: a value ``env.name`` may take (the native pool's test game is not)
    configurable: bool = True
    #: an env error ends that episode (counted) instead of stopping the run
    errors_end_episode: bool = True
    #: the trajectory's reward is the env's own summed reward, not ``algo.success_reward`` on a win
    env_reward: bool = False
    #: a finished episode's task score: ``won`` (1/0) or the pool's ``score``
    task_score: str = "won"
    #: the prompt family has built-in skills for the teacher (else a skills folder, or the env's
    #: privileged text, is what the teacher reads)
    builtin_skills: bool = True
    #: the config keys only this kind reads
    keys: tuple[Key, ...] = ()
    #: the ``--split`` names of ``python -m pcsd.eval`` this kind plays
    eval_splits: tuple[str, ...] = ()
    #: the evaluation table its results go in (:mod:`pcsd.envs.tables`)
    table: str = "success"
    #: task type -> the column its results go in (:meth:`category`), and the columns' order
    category_names: Mapping[str, str] = {}
    categories: tuple[str, ...] = ()

    # ---- config
    def check(self, cfg: Any) -> Optional[str]:
        """What is wrong with the config for this kind (None when nothing is), one line naming the
        key. Called after the common checks, before anything is written."""
        return None

    def template(self, cfg: Any, run_dir: Optional[Path] = None) -> Optional[str]:
        """The Jinja source of the prompts (None: the prompt family's own); a run's saved copy when
        ``run_dir`` holds one."""
        return None

    def gives_privileged(self, cfg: Any) -> bool:
        """Whether the env gives the teacher privileged text of its own (``info["privileged"]``),
        so that a method with a teacher needs no skills folder."""
        return False

    def expert_sample(self, cfg: Any) -> Optional[tuple[str, str, str]]:
        """``(task, observation, action)`` of one expert step the config check saw (None: none
        without playing), for checking the warm-up's response budget at config read."""
        return None

    def replaced_keys(self, cfg: Any, command_line: Mapping[str, str]) -> tuple[str, ...]:
        """Keys of the preset that belong to what the command line replaced (another env class
        named on the command line: the preset's arguments of its own class): reset to their
        defaults before the command line applies."""
        return ()

    # ---- pools
    def pools(self, options: Optional[Mapping[str, Any]] = None) -> Pools:
        """This kind's :class:`Pools` from loose options (a test's or a benchmark's dict), checked
        once here: a wrong option is a ValueError naming it."""
        raise ValueError(f"env.name={self.name}: this kind has no pool")

    # ---- a training run
    def open(self, cfg: Any, run_dir: Path, *, main: bool, barrier: Callable[[], None]) -> EnvRun:
        """The env side of a training run (its task lists, pools, warm-up); ``main``: this process
        writes the run's files (``barrier`` waits for it on the other ranks)."""
        raise ValueError(f"env.name={self.name}: not an environment the trainer trains on")

    # ---- results
    def category(self, task_type: str) -> str:
        """The column a task type's results go in (ALFWorld: the paper's category name)."""
        return self.category_names.get(task_type, task_type)

    def result_fields(self, games: Sequence[Any]) -> dict[str, Any]:
        """The kind's figures of one evaluation's games (:class:`pcsd.eval.run.GameResult`):
        ``per_category`` and ``counts`` (success per task category), ``score``/``acc``,
        ``mean_reward``; what it has not is left out."""
        return dict(mean_reward=sum(float(g.score or 0.0) for g in games) / max(len(games), 1))

    def describe_result(self, result: Mapping[str, Any]) -> str:
        """The evaluation's figures beside Success on the console (`` (mean reward r)``)."""
        r = result.get("mean_reward")
        return "" if r is None else f" (mean reward {r:.3f})"

    def summary_fields(self, result: Mapping[str, Any], when: str) -> dict[str, Any]:
        """Summary keys of an evaluation ``when`` = ``before`` / ``after`` RL besides success."""
        return {f"mean_reward_{when}": result.get("mean_reward")}

    def validation_fields(self, result: Mapping[str, Any]) -> dict[str, Any]:
        """Metrics keys of a validation during RL besides ``val_success``."""
        return {}

    def step_fields(self, batch: Any) -> dict[str, Any]:
        """Metrics keys of one RL step's rollouts (:class:`pcsd.rollout.loop.RolloutBatch`)."""
        return {"env_errors": batch.env_errors}

    # ---- python -m pcsd.eval
    def add_eval_arguments(self, parser: Any) -> None:
        """This kind's own options of ``python -m pcsd.eval`` (an argparse group)."""

    def eval_plan(
        self, split: str, args: Any, run_dir: Optional[Path], run_cfg: Mapping[str, Any], out_dir: Path
    ) -> EvalPlan:
        """What ``--split split`` plays (``run_cfg``: the evaluated run's config, ``{}`` for a
        model that is not a run); raises :class:`TaskError` for a bad argument."""
        raise TaskError(f"split={split}: env.name={self.name} has no evaluation")

    def check_eval_arguments(self, splits: Sequence[str], args: Any) -> None:
        """Refuses options of this kind given without one of its splits, or options of other kinds
        given with it (:class:`TaskError`)."""

    def __repr__(self) -> str:
        return f"<env kind {self.name}>"


class EnvRun:
    """The env side of one training run (:meth:`EnvKind.open`): what the job asks of its kind."""

    #: the evaluation rows' split name
    split: str = ""
    #: the training task list (RL steps draw from it)
    train_tasks: Sequence[Any] = ()

    def __init__(self, kind: EnvKind, cfg: Any) -> None:
        self.kind, self.cfg = kind, cfg

    @property
    def train_pools(self) -> Pools:
        raise NotImplementedError

    @property
    def eval_pools(self) -> Pools:
        raise NotImplementedError

    def step_tasks(self, step: int, rng: random.Random, batch: int = 0) -> list[Any]:
        """The ``rollout.tasks_per_step`` tasks batch ``batch`` of RL step ``step`` plays (``rng``:
        the run's task sampler, checkpointed with the run; ``batch`` > 0: a further batch of
        ``rollout.dynamic_sampling``)."""
        tasks = self.train_tasks
        return [tasks[rng.randrange(len(tasks))] for _ in range(int(self.cfg.rollout.tasks_per_step))]

    def eval_tasks(self, index: int) -> list[Any]:
        """The tasks of validation number ``index`` (0: before RL)."""
        raise NotImplementedError

    def no_expert(self) -> Optional[str]:
        """Why the warm-up cannot run (``"<env> has no expert_action() to learn from"``), or None."""
        return None

    def warmup(self, count: int, *, skills: Any) -> Warmup:
        """The warm-up's expert episodes on ``count`` warm-up tasks (``skills``: the teacher's
        :class:`pcsd.text.prompts.SkillRepository` or None)."""
        raise NotImplementedError

    def demonstrations(self, episodes: list[ExpertEpisode]) -> list[ExpertEpisode]:
        """The episodes the warm-up imitates (default: every one)."""
        return episodes

    def tokenizer_words(self) -> list[str]:
        """Words the generated tiny model's tokenizer keeps whole (e.g. product ids)."""
        return []

    def tokenizer_corpus(self, episodes: list[ExpertEpisode]) -> list[str]:
        """More tokenizer text when ``episodes`` (the warm-up's) say too little, e.g. without an
        expert."""
        return []

    def close(self) -> None:
        """Ends what the run's envs hold (worker processes)."""
