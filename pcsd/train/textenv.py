"""Python text environments in the trainer (``env.name=gym``, and the other Python kinds of
:mod:`pcsd.envs.registry`): the config checks, the env factories, the tasks of each phase.

* Tasks are reset seeds, in three ranges that never overlap: training draws from
  ``[0, TRAIN_SEEDS)`` (:func:`train_seeds`), the warm-up's expert plays ``SFT_SEED_BASE + i``
  and evaluations play ``EVAL_SEED_BASE + i`` (``i < eval.episodes``, the same seeds before and
  after RL). An env with its own splits gets ``env.eval_kwargs`` (merged over ``env.kwargs``) for
  its evaluation envs.
* Checked when the config is read (:func:`check_text_env_config`, one line naming the key): the
  kind's keys (a missing entry point, keys of another kind), the template file (it compiles and
  renders), the skills a method needs, and the env itself: one env is built in a worker process
  and plays a reset and a step (:func:`pcsd.envs.pypool.check_env`), so a missing package, a bad
  entry point, bad keyword arguments, an env that raises, hangs, dies or returns non-text is
  reported before anything is loaded.
"""

from __future__ import annotations

import pickle
from typing import Any, Optional

from pcsd.eval.games import TEXT_ENV_EVAL_SEED_BASE, text_env_eval_seeds

__all__ = [
    "EVAL_SEED_BASE",
    "SFT_SEED_BASE",
    "TRAIN_SEEDS",
    "check_text_env_config",
    "env_check",
    "eval_seeds",
    "factories",
    "needs_skills",
    "sft_seeds",
    "template_source",
    "train_seeds",
]

#: training tasks are the seeds [0, TRAIN_SEEDS); the warm-up's and the evaluations' are above
TRAIN_SEEDS = 500_000_000
SFT_SEED_BASE = 500_000_000
EVAL_SEED_BASE = TEXT_ENV_EVAL_SEED_BASE

#: keys of the procedural ALFWorld games and of WebShop, which a Python env must leave unset
_OTHER_KINDS = ("env.receptacles", "env.distractors", "env.task_types", "env.rooms", "env.webshop_data")
#: keys of the Python kinds, which ALFWorld and WebShop must leave unset
_PYTHON_ONLY = ("env.entry_point", "env.id", "env.url", "env.template")

_CHECKS: dict[bytes, Any] = {}  # the env checks of this process, by factory


def _spec(cfg: Any):
    from pcsd.envs.registry import get

    return get(str(cfg.env.name))


def _env_section(cfg: Any, kwargs_key: str = "kwargs") -> dict:
    from omegaconf import DictConfig, OmegaConf

    env = cfg.env
    d = OmegaConf.to_container(env, resolve=True) if isinstance(env, DictConfig) else dict(env)
    if kwargs_key == "eval_kwargs":
        d["kwargs"] = {**(d.get("kwargs") or {}), **(d.get("eval_kwargs") or {})}
    return d


def factories(cfg: Any) -> tuple[Any, Any]:
    """The env factories of training and of evaluation (``env.eval_kwargs`` merged over
    ``env.kwargs``; the same factory without them)."""
    spec = _spec(cfg)
    train = spec.factory(_env_section(cfg))
    if not cfg.env.get("eval_kwargs"):
        return train, train
    return train, spec.factory(_env_section(cfg, "eval_kwargs"))


def train_seeds(count: int) -> list[int]:
    """The training task list: seeds ``0 .. count - 1`` (``count < TRAIN_SEEDS``); the trainer
    draws each step's tasks from it with its seeded generator, as it draws ALFWorld games."""
    return list(range(min(count, TRAIN_SEEDS)))


def sft_seeds(count: int) -> list[int]:
    return [SFT_SEED_BASE + i for i in range(count)]


def eval_seeds(count: int) -> list[int]:
    """The evaluation tasks: ``count`` (0: 128) fixed seeds above every training seed."""
    return text_env_eval_seeds(count)


def needs_skills(cfg: Any) -> bool:
    """Whether the method reads the teacher's skills (distillation, RLSD, Skill-GRPO, the starred
    evaluations)."""
    trains = cfg.optim.steps > 0
    return bool((trains and (cfg.algo.distill or cfg.algo.student_skills)) or cfg.eval.skills)


def template_source(cfg: Any, run_dir: Any = None) -> Optional[str]:
    """The text of ``env.template`` (None: the built-in template); a run's own copy
    (``<run_dir>/template.jinja``, written when the run started) when there is one."""
    from pcsd.train.paths import resolve_config_path

    if cfg.env.get("template") is None:
        return None
    if run_dir is not None and (run_dir / "template.jinja").is_file():
        return (run_dir / "template.jinja").read_text(encoding="utf-8")
    path = resolve_config_path(str(cfg.env.template))
    if not path.is_file():
        raise ValueError(
            f"env.template={cfg.env.template}: no such file (expected a Jinja template; a relative path "
            "is looked up in the current folder, then next to the presets)"
        )
    return path.read_text(encoding="utf-8")


def env_check(factory: Any, timeout: float) -> Any:
    """:func:`pcsd.envs.pypool.check_env` of ``factory`` (once per process and factory)."""
    from pcsd.envs.pypool import check_env

    key = pickle.dumps((factory, timeout))
    if key not in _CHECKS:
        _CHECKS[key] = check_env(factory, timeout=timeout)
    return _CHECKS[key]


def _entry_key(cfg: Any) -> str:
    for key in ("entry_point", "id", "url"):
        if cfg.env.get(key) is not None:
            return f"env.{key}={cfg.env.get(key)}"
    start = (cfg.env.get("kwargs") or {}).get("start")
    return f"env.kwargs.start={start}" if start is not None else "env.kwargs"


def _check_env(cfg: Any, factory: Any, kwargs_key: str) -> Optional[str]:
    from pcsd.envs.protocol import EnvBuildError, ProtocolError

    timeout = float(cfg.env.step_timeout)
    try:
        env_check(factory, timeout)
    except EnvBuildError as exc:
        if kwargs_key == "eval_kwargs" or (exc.stage == "construct" and "TypeError" in str(exc) and cfg.env.kwargs):
            return f"env.{kwargs_key}={dict(cfg.env.get(kwargs_key))}: {exc}"
        return f"{_entry_key(cfg)}: {exc}"
    except ProtocolError as exc:
        where = f"env.eval_kwargs={dict(cfg.env.eval_kwargs)}" if kwargs_key == "eval_kwargs" else _entry_key(cfg)
        return f"{where}: the env does not follow pcsd's text-env protocol (docs/environments.md): {exc}"
    return None


def check_text_env_config(cfg: Any) -> Optional[str]:
    """What is wrong with the config's environment keys for its kind (None when nothing is)."""
    from omegaconf import OmegaConf

    spec = _spec(cfg)
    if not spec.python:
        for key in _PYTHON_ONLY:
            if OmegaConf.select(cfg, key) is not None:
                return (
                    f"{key} is a setting of the Python environments (env.name=gym, ...); env.name={spec.name} has none"
                )
        for key in ("kwargs", "eval_kwargs"):
            if cfg.env.get(key):
                return (
                    f"env.{key} is a setting of the Python environments (env.name=gym, ...); env.name={spec.name} "
                    "has none"
                )
        return None
    for key in _OTHER_KINDS:
        if OmegaConf.select(cfg, key) is not None:
            return f"{key} is an ALFWorld / WebShop setting; env.name={spec.name} has none (leave it null)"
    if cfg.env.get("usual_place", 0.0):
        return f"env.usual_place is a procedural ALFWorld setting; env.name={spec.name} has none (leave it 0)"
    for key in ("id", "entry_point", "url"):
        if cfg.env.get(key) is not None and key not in spec.keys:
            return (
                f"env.{key} is not a setting of env.name={spec.name} (its keys: "
                + ", ".join(f"env.{k}" for k in spec.keys)
                + ")"
            )
    if cfg.optim.get("sft_teacher_demos", "same") == "skills":
        return (
            "optim.sft_teacher_demos=skills uses the ALFWorld expert that follows the skills; a Python env has "
            "only its own expert_action (expected optim.sft_teacher_demos=same)"
        )
    if cfg.eval.get("protocol", "full") == "paper":
        return (
            f"eval.protocol=paper draws verl-agent's ALFWorld / WebShop validation episodes; env.name={spec.name} "
            "evaluates eval.episodes fixed seeds (use eval.protocol=full)"
        )
    if not cfg.env.step_timeout > 0:
        return f"env.step_timeout must be > 0 seconds, got {cfg.env.step_timeout}"
    if needs_skills(cfg) and cfg.env.get("skills_dir") is None:
        return (
            f"env.skills_dir: method {cfg.method} reads the teacher's skills, and env.name={spec.name} has none "
            "built in: set env.skills_dir to a skills folder (docs/environments.md, 'Skills'), or train without "
            "a teacher (method=grpo)"
        )
    try:
        src = template_source(cfg)
    except ValueError as exc:
        return str(exc)
    if src is not None:
        problem = _check_template(src)
        if problem:
            return f"env.template={cfg.env.template}: {problem}"
    for key in ("kwargs", "eval_kwargs"):
        v = cfg.env.get(key)
        if v is not None and not OmegaConf.is_dict(v) and not isinstance(v, dict):
            return f"env.{key}: expected a mapping of keyword arguments, got {v!r}"
    try:
        train, evaluation = factories(cfg)
    except ValueError as exc:
        return str(exc)
    problem = _check_env(cfg, train, "kwargs")
    if problem is None and evaluation is not train:
        problem = _check_env(cfg, evaluation, "eval_kwargs")
    return problem


def _check_template(src: str) -> Optional[str]:
    """A template that does not compile, or fails on a first step or a later one (an unknown
    variable), as one line."""
    from pcsd.text.prompts import PromptBuilder

    try:
        b = PromptBuilder("text", history_length=2, max_prompt_tokens=None, template=src)
        b.build("a task", "an observation", ["an action", "another"], [], 0)
        b.build("a task", "an observation", [], [("an earlier observation", "an action")], 1)
    except ValueError as exc:
        return " ".join(str(exc).split())
    return None


def corpus_of_resets(pool: Any) -> list[str]:
    """Tokenizer text when there is no expert: the tasks, first observations and admissible
    actions of one reset of every env of ``pool``."""
    b = pool.reset()
    lines: list[str] = []
    for e, o, adm in zip(b.env_id.tolist(), b.obs, b.admissible):
        lines += [f"Your task is to: {pool.task_of(e)[1]}", o]
        if adm:
            lines.append("[" + "\n ".join(f"'{a}'" for a in adm) + "]")
    return lines
