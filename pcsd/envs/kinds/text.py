"""Python text environments (``env.name=gym``, ``textarena``, ``openenv``): the config checks, the env
factories, the tasks of each phase, the pools in worker processes, the evaluation of ``--split env``
(moved here from ``pcsd/train/textenv.py``, the factories from the registry).

* ``gym``: any env of the protocol (:mod:`pcsd.envs.protocol`): ``env.entry_point=module:Class`` or
  ``env.id=<a registered Gymnasium id>``, with ``env.kwargs``; ``textarena``: a single-player game of
  TextArena (``env.id=<game id>``, :mod:`pcsd.envs.textarena`); ``openenv``: an OpenEnv server
  (``env.url``, or ``env.kwargs.start=module:app`` served by pcsd once per process,
  :mod:`pcsd.envs.openenv`).
* Tasks are reset seeds, in three ranges that never overlap: training draws from
  ``[0, TRAIN_SEEDS)`` (:func:`train_seeds`), the warm-up's expert plays ``SFT_SEED_BASE + i``
  and evaluations play ``EVAL_SEED_BASE + i`` (``i < eval.episodes``, the same seeds before and
  after RL, and in ``python -m pcsd.eval``). An env with its own splits gets ``env.eval_kwargs``
  (merged over ``env.kwargs``) for its evaluation envs.
* Checked when the config is read (:meth:`PythonKind.check`, one line naming the key): the kind's
  keys (a missing entry point, keys of another kind), the template file (it compiles and renders),
  the skills a method needs (a teacher reads a skills folder or the env's own privileged text), and
  the env itself: one env is built in a worker process and plays a reset and a step
  (:func:`pcsd.envs.pypool.check_env`), so a missing package, a bad entry point, bad keyword
  arguments, an env that raises, hangs, dies or returns non-text is reported before anything is
  loaded.
* The preset's ``env.kwargs`` (and its other settings of its env class: ``env.eval_kwargs``,
  ``env.template``, ``env.skills_dir``) belong to the preset's entry point: another
  ``env.entry_point`` / ``env.id`` / ``env.url`` on the command line starts without them
  (:meth:`PythonKind.replaced_keys`).
* Success is the env's ``info["won"]``, else the summed reward >= ``env.success_threshold``; the
  reward is the env's summed reward; an env's exception, hang or crash ends its episode (counted).
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import pickle
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Callable, Optional

from pcsd.envs.kind import EnvKind, EnvRun, EvalPlan, Key, Pool, Pools, TaskError, Warmup
from pcsd.envs.protocol import EnvFactory

__all__ = [
    "EVAL_EPISODES",
    "EVAL_SEED_BASE",
    "GYM",
    "OPENENV",
    "PythonKind",
    "PythonPools",
    "SFT_SEED_BASE",
    "TEXTARENA",
    "TRAIN_SEEDS",
    "corpus_of_resets",
    "env_check",
    "eval_seeds",
    "factories",
    "sft_seeds",
    "template_source",
    "train_seeds",
]

#: training tasks are the seeds [0, TRAIN_SEEDS); the warm-up's and the evaluations' are above
TRAIN_SEEDS = 500_000_000
SFT_SEED_BASE = 500_000_000
EVAL_SEED_BASE = 1_000_000_000
EVAL_EPISODES = 128  # when eval.episodes / --episodes is 0

_CHECKS: dict[bytes, Any] = {}  # the env checks of this process, by factory


# ----------------------------------------------------------------------------- tasks
def train_seeds(count: int) -> list[int]:
    """The training task list: seeds ``0 .. count - 1`` (``count < TRAIN_SEEDS``); the trainer
    draws each step's tasks from it with its seeded generator, as it draws ALFWorld games."""
    return list(range(min(count, TRAIN_SEEDS)))


def sft_seeds(count: int) -> list[int]:
    return [SFT_SEED_BASE + i for i in range(count)]


def eval_seeds(count: int = 0) -> list[int]:
    """The evaluation tasks: ``count`` (0: 128) fixed seeds above every training seed; the trainer
    and ``python -m pcsd.eval`` evaluate on the same ones."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise TaskError(f"count={count!r}: expected a non-negative int (0 = {EVAL_EPISODES})")
    return [EVAL_SEED_BASE + i for i in range(count or EVAL_EPISODES)]


# ----------------------------------------------------------------------------- factories
def _kwargs(env: Mapping[str, Any]) -> dict[str, Any]:
    kw = env.get("kwargs") or {}
    if not isinstance(kw, Mapping):
        raise ValueError(f"env.kwargs: expected a mapping of keyword arguments, got {type(kw).__name__}")
    for k in kw:
        if not isinstance(k, str) or not k.isidentifier():
            raise ValueError(f"env.kwargs: {k!r} is not a keyword argument name")
    return dict(kw)


def _require(key: str, module: str, package: str, extra: str) -> None:
    """ValueError naming ``key`` and the extra to install when ``module`` cannot be imported."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise ValueError(f"{key} needs the '{package}' package, which is not installed: pip install 'pcsd[{extra}]'")


def _gym_factory(env: Mapping[str, Any]) -> EnvFactory:
    entry, env_id = env.get("entry_point"), env.get("id")
    if (entry is None) == (env_id is None):
        raise ValueError(
            "env.entry_point: env.name=gym needs exactly one of env.entry_point=module:Class "
            "(importable from the current folder or the installed packages) and env.id=<a registered "
            "Gymnasium id>" + (", not both" if entry is not None else "")
        )
    if env_id is not None:
        _require(f"env.id={env_id}", "gymnasium", "gymnasium", "gym")
    return EnvFactory(entry_point=entry, id=env_id, kwargs=_kwargs(env))


def _textarena_factory(env: Mapping[str, Any]) -> EnvFactory:
    if not env.get("id"):
        raise ValueError("env.id: env.name=textarena needs env.id=<a TextArena game id>, e.g. GuessTheNumber-v0")
    _require("env.name=textarena", "textarena", "textarena==0.7.4", "textarena")
    return EnvFactory(
        entry_point="pcsd.envs.textarena:TextArenaEnv",
        kwargs={"env_id": env["id"], **_kwargs(env)},
        label=str(env["id"]),
    )


#: OpenEnv servers this process started (``env.kwargs.start``), by app and folder: one per process,
#: shared by every factory of it, stopped when the process exits (or dies: pcsd.envs.openenv)
_SERVED: dict[tuple[str, Optional[str]], Any] = {}


def _served(app: str, app_dir: Optional[str], start_timeout_s: float) -> str:
    """The address of this process's server of ``app`` (started on first use)."""
    from pcsd.envs.openenv import OpenEnvServer, check

    key = (app, app_dir and os.path.abspath(app_dir))
    server = _SERVED.get(key)
    if server is None or not server.alive:
        try:
            check(start=app, app_dir=app_dir)
            server = OpenEnvServer(app, app_dir=app_dir, start_timeout_s=start_timeout_s).start()
        except (ValueError, TypeError, RuntimeError, TimeoutError) as exc:
            raise ValueError(f"env.kwargs.start={app}: {' '.join(str(exc).split())}") from None
        _SERVED[key] = server
    return server.base_url


@atexit.register
def _stop_served() -> None:
    for server in _SERVED.values():
        server.stop()
    _SERVED.clear()


def _openenv_factory(env: Mapping[str, Any]) -> EnvFactory:
    kw = _kwargs(env)
    url, start = env.get("url"), kw.pop("start", None)
    if (url is None) == (start is None):
        raise ValueError(
            "env.url: env.name=openenv needs env.url=<a running server's address, http://host:port> or "
            "env.kwargs.start=<module:app, an OpenEnv app to serve on 127.0.0.1>"
            + (", not both" if url is not None else "")
        )
    _require("env.name=openenv", "websockets", "websockets", "openenv")
    app_dir = kw.pop("app_dir", None)
    start_timeout_s = kw.pop("start_timeout_s", 120.0)
    if start is not None:
        _require(f"env.kwargs.start={start}", "uvicorn", "openenv-core==0.3.0", "openenv")
        if not isinstance(start, str):
            raise ValueError(f"env.kwargs.start: expected module:app (an OpenEnv app), got {start!r}")
        if app_dir is not None and not isinstance(app_dir, str):
            raise ValueError(f"env.kwargs.app_dir: expected a folder, got {app_dir!r}")
        if isinstance(start_timeout_s, bool) or not isinstance(start_timeout_s, (int, float)) or start_timeout_s <= 0:
            raise ValueError(f"env.kwargs.start_timeout_s: expected seconds > 0, got {start_timeout_s!r}")
        url = _served(start, app_dir, float(start_timeout_s))
    elif app_dir is not None or "start_timeout_s" in (env.get("kwargs") or {}):
        raise ValueError(
            "env.kwargs.app_dir / start_timeout_s: settings of env.kwargs.start (a server pcsd starts); "
            "env.url names a running one"
        )
    return EnvFactory(
        entry_point="pcsd.envs.openenv:OpenEnvEnv",
        kwargs={"base_url": url, **kw},
        label=str(start if start is not None else url),
    )


def _env_section(cfg: Any, kwargs_key: str = "kwargs") -> dict:
    from omegaconf import DictConfig, OmegaConf

    env = cfg.env
    d = OmegaConf.to_container(env, resolve=True) if isinstance(env, DictConfig) else dict(env)
    assert isinstance(d, dict)
    if kwargs_key == "eval_kwargs":
        d["kwargs"] = {**(d.get("kwargs") or {}), **(d.get("eval_kwargs") or {})}
    return d


def factories(cfg: Any) -> tuple[EnvFactory, EnvFactory]:
    """The env factories of training and of evaluation (``env.eval_kwargs`` merged over
    ``env.kwargs``; the same factory without them)."""
    kind = _kind_of(str(cfg.env.name))
    train = kind.factory(_env_section(cfg))
    if not cfg.env.get("eval_kwargs"):
        return train, train
    return train, kind.factory(_env_section(cfg, "eval_kwargs"))


def _kind_of(name: str) -> PythonKind:
    for k in (GYM, TEXTARENA, OPENENV):
        if k.name == name:
            return k
    raise ValueError(f"env.name={name}: not a Python environment")


def env_check(factory: Any, timeout: float) -> Any:
    """:func:`pcsd.envs.pypool.check_env` of ``factory`` (once per process and factory)."""
    from pcsd.envs.pypool import check_env

    key = pickle.dumps((factory, timeout))
    if key not in _CHECKS:
        _CHECKS[key] = check_env(factory, timeout=timeout)
    return _CHECKS[key]


def template_source(cfg: Any, run_dir: Optional[Path] = None) -> Optional[str]:
    """The text of ``env.template`` (None: the built-in template; a relative path is read from the
    current folder, else from the presets' folder ``pcsd/train/configs/``, as ``env.skills_dir``); a run's own copy (``<run_dir>/template.jinja``, written when the run started)
    when there is one."""
    if cfg.env.get("template") is None:
        return None
    if run_dir is not None and (run_dir / "template.jinja").is_file():
        return (run_dir / "template.jinja").read_text(encoding="utf-8")
    from pcsd.text.paths import resolve_config_path

    path = resolve_config_path(str(cfg.env.template))  # as env.skills_dir: the current folder, else the presets'
    if not path.is_file():
        raise ValueError(
            f"env.template={cfg.env.template}: no such file (expected a Jinja template; a relative path is read "
            f"from the current folder, {os.getcwd()}, else from the presets' folder)"
        )
    return path.read_text(encoding="utf-8")


def check_template(src: str) -> Optional[str]:
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


# ----------------------------------------------------------------------------- pools
class PythonPools(Pools):
    """Pools of Python envs in worker processes: ``make_env`` is the env factory (every pool starts
    its own workers) or running :class:`pcsd.envs.pypool.EnvWorkers` (every pool is laid over
    them); ``success_threshold``, ``step_timeout`` and the resets' ``options`` are every pool's."""

    def __init__(
        self,
        kind: EnvKind,
        make_env: Any,
        *,
        success_threshold: Optional[float] = 1.0,
        step_timeout: float = 60.0,
        reset_options: Optional[Mapping[str, Any]] = None,
    ) -> None:
        from pcsd.envs.pypool import EnvWorkers

        super().__init__(kind)
        if make_env is None or not (isinstance(make_env, EnvWorkers) or callable(make_env)):
            raise ValueError(
                f"make_env: env kind {kind.name!r} needs its env factory or running EnvWorkers, got {make_env!r}"
            )
        self.make_env = make_env
        self.success_threshold = success_threshold
        self.step_timeout = float(step_timeout)
        self.reset_options = None if reset_options is None else dict(reset_options)

    def make(
        self, num_envs: int, group_size: int, tasks: Sequence[Any] | int, *, max_steps: int, num_threads: int, seed: int
    ) -> Pool:
        from pcsd.envs.pypool import PythonEnvPool

        if isinstance(tasks, int):
            raise ValueError(f"games: env kind {self.kind.name!r} needs one reset seed per group, got a count")
        return PythonEnvPool(
            self.make_env,
            num_envs,
            group_size=group_size,
            seeds=list(tasks),
            max_steps=max_steps,
            num_workers=num_threads,
            options=self.reset_options,
            success_threshold=self.success_threshold,
            step_timeout=self.step_timeout,
        )

    def describe(self) -> str:
        what = getattr(self.make_env, "describe", None)
        text = what() if callable(what) else what
        return f"{self.kind.name} {text}" if text else self.kind.name


# ----------------------------------------------------------------------------- the kinds
_COMMON = (
    Key("kwargs", dict[str, Any], {}, "keyword arguments of the env's constructor (the game's, the client's)"),
    Key("eval_kwargs", dict[str, Any], {}, "merged over env.kwargs for the evaluation envs (its splits)"),
    Key("template", Optional[str], None, "a Jinja file for the prompts (null: the built-in template)"),
    Key("success_threshold", float, 1.0, "success without info['won']: summed reward >= this"),
    Key("step_timeout", float, 60.0, "seconds one reset/step of one env may take (a hang past it is its error)"),
)
_ENTRY = Key("entry_point", Optional[str], None, "gym: module:Class, importable from the current folder")
_ID = Key("id", Optional[str], None, "gym: a registered Gymnasium id; textarena: the game id")
_URL = Key("url", Optional[str], None, "openenv: the environment server's address")


class PythonKind(EnvKind):
    """A kind of Python text environment (``gym``, ``textarena``, ``openenv``)."""

    prompt = "text"
    python = True
    env_reward = True
    task_score = "score"
    builtin_skills = False
    eval_splits = ("env",)
    table = "success"

    def __init__(
        self,
        name: str,
        title: str,
        description: str,
        make_factory: Callable[[Mapping[str, Any]], EnvFactory],
        keys: tuple[Key, ...],
    ) -> None:
        self.name, self.title, self.description = name, title, description
        self.make_factory = make_factory
        self.keys = keys + _COMMON

    def factory(self, env: Mapping[str, Any]) -> EnvFactory:
        """The factory of one env of this kind from the config's ``env`` section (ValueError
        naming the key)."""
        return self.make_factory(env)

    # ---- config
    def replaced_keys(self, cfg: Any, command_line: Mapping[str, str]) -> tuple[str, ...]:
        which = [k for k in ("entry_point", "id", "url") if f"env.{k}" in command_line]
        start = "env.kwargs.start" in command_line
        if not which and not start:
            return ()
        if all(str(cfg.env.get(k)) == command_line[f"env.{k}"] for k in which) and not start:
            return ()  # the preset's own env class, named again
        return ("kwargs", "eval_kwargs", "template", "skills_dir")

    def check(self, cfg: Any) -> Optional[str]:
        from omegaconf import OmegaConf

        if cfg.eval.get("protocol", "full") == "paper":
            return (
                f"eval.protocol=paper draws verl-agent's ALFWorld / WebShop validation episodes; env.name={self.name} "
                "evaluates eval.episodes fixed seeds (use eval.protocol=full)"
            )
        if not cfg.env.step_timeout > 0:
            return f"env.step_timeout must be > 0 seconds, got {cfg.env.step_timeout}"
        try:
            src = template_source(cfg)
        except ValueError as exc:
            return str(exc)
        if src is not None:
            problem = check_template(src)
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
        if problem is None and cfg.optim.get("sft_teacher_demos", "same") == "skills" and cfg.optim.sft_steps > 0:
            check = env_check(train, float(cfg.env.step_timeout))
            if not check.expert_takes_privileged:
                return (
                    f"optim.sft_teacher_demos=skills: the warm-up asks the env's expert_action(privileged=True) for "
                    f"the teacher's examples and privileged=False for the student's; {train.describe()}'s "
                    "expert_action takes no privileged argument (expected optim.sft_teacher_demos=same)"
                )
        return problem

    def expert_sample(self, cfg: Any) -> Optional[tuple[str, str, str]]:
        check = env_check(factories(cfg)[0], float(cfg.env.step_timeout))
        return (check.task, check.observation, check.action) if check.has_expert else None

    def gives_privileged(self, cfg: Any) -> bool:
        return bool(env_check(factories(cfg)[0], float(cfg.env.step_timeout)).privileged)

    def template(self, cfg: Any, run_dir: Optional[Path] = None) -> Optional[str]:
        return template_source(cfg, run_dir)

    def pools(self, options: Optional[Mapping[str, Any]] = None) -> Pools:
        opts = dict(options or {})
        known = ("make_env", "success_threshold", "step_timeout", "reset_options")
        bad = [k for k in opts if k not in known]
        if bad:
            raise ValueError(f"{bad[0]}: not an option of env kind {self.name!r} (its options: {', '.join(known)})")
        if opts.get("make_env") is None:
            raise ValueError(f"make_env: env kind {self.name!r} needs options['make_env'] (its factory or workers)")
        return PythonPools(self, opts.pop("make_env"), **opts)

    def open(self, cfg: Any, run_dir: Path, *, main: bool, barrier: Callable[[], None]) -> EnvRun:
        return PythonRun(self, cfg, main)

    # ---- python -m pcsd.eval
    def add_eval_arguments(self, parser: Any) -> None:
        g = parser.add_argument_group("Python text environments (--split env)")
        g.add_argument(
            "--env",
            action="append",
            default=None,
            metavar="KEY=VALUE",
            help="split=env: a key of the run's env section to override (repeat), e.g. name=gym, "
            "entry_point=examples.keydoor:KeyDoorEnv, kwargs.colors=4, template=my.jinja",
        )

    def check_eval_arguments(self, splits: Sequence[str], args: Any) -> None:
        if args.env and "env" not in splits:
            raise TaskError("env: --env sets the Python environment of split=env, which --split does not name")
        if "env" in splits and (args.protocol == "paper" or args.games_file or args.task_types):
            raise TaskError(
                "split=env plays a Python environment's fixed evaluation seeds (--episodes, --count); "
                "--protocol paper, --games-file and --task-types select ALFWorld / WebShop episodes"
            )

    def eval_plan(
        self, split: str, args: Any, run_dir: Optional[Path], run_cfg: Mapping[str, Any], out_dir: Path
    ) -> EvalPlan:
        """``--split env``: the run's environment (``--env`` overriding its keys), checked as the
        trainer checks it, on the trainer's evaluation seeds, with the run's template."""
        from pcsd.envs.protocol import EnvBuildError, ProtocolError
        from pcsd.envs.pypool import check_env

        env = _eval_section(args, run_cfg)
        kind = next((k for k in (GYM, TEXTARENA, OPENENV) if k.name == env["name"]), None)
        if kind is None:
            raise TaskError(f"env: name={env['name']} is not a Python environment (split=env); use its own --split")
        section = dict(env, kwargs={**(env.get("kwargs") or {}), **(env.get("eval_kwargs") or {})})
        try:
            factory = kind.factory(section)
            timeout = float(env.get("step_timeout") or 60.0)
            check_env(factory, timeout=timeout)
        except (ValueError, EnvBuildError, ProtocolError) as exc:
            raise TaskError(f"env: {exc}") from None
        template = None
        if env.get("template") and any(
            o.split("=", 1)[0].strip().removeprefix("env.") == "template" for o in args.env or []
        ):
            path = Path(str(env["template"])).expanduser()
            if not path.is_file():
                raise TaskError(f"env: template={path}: no such file")
            template = path.read_text(encoding="utf-8")
        elif run_dir is not None and (run_dir / "template.jinja").is_file():
            template = (run_dir / "template.jinja").read_text(encoding="utf-8")
        elif env.get("template"):
            raise TaskError(
                f"model={run_dir}: the run used env.template={env['template']} but holds no copy of it "
                "(template.jinja); pass it as --env template=FILE"
            )
        seeds = eval_seeds(args.episodes or int((run_cfg.get("eval") or {}).get("episodes") or 0))
        if args.count:
            seeds = seeds[: args.count]
        pools = PythonPools(
            kind, factory, success_threshold=float(env.get("success_threshold", 1.0)), step_timeout=timeout
        )
        return EvalPlan(tasks=seeds, pools=pools, split=pools.describe(), template=template)


def _eval_section(args: Any, run_cfg: Mapping[str, Any]) -> dict:
    """The env section of ``--split env``: the run's (when it trained on a Python env) with the
    ``--env`` overrides."""
    from omegaconf import OmegaConf

    run_env = dict(run_cfg.get("env") or {})
    base = run_env if str(run_env.get("name")) in {k.name for k in (GYM, TEXTARENA, OPENENV)} else {}
    over = []
    for o in args.env or []:
        if "=" not in o:
            raise TaskError(f"env={o!r}: expected KEY=VALUE, e.g. entry_point=examples.keydoor:KeyDoorEnv")
        k, v = o.split("=", 1)
        over.append(f"{k.strip().removeprefix('env.')}={v}")
    try:
        env = OmegaConf.to_container(OmegaConf.merge(OmegaConf.create(base), OmegaConf.from_dotlist(over)))
    except Exception as exc:
        raise TaskError(f"env: {str(exc).splitlines()[0]}") from None
    assert isinstance(env, dict)
    if not env.get("name"):
        raise TaskError(
            "split=env needs a Python environment: evaluate a run trained on one, or name it with "
            "--env name=gym --env entry_point=module:Class (or --env id=<Gymnasium id>)"
        )
    return env


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


class PythonRun(EnvRun):
    """A Python env's side of a training run: worker processes holding the training and the
    evaluation envs for the whole run; tasks are reset seeds."""

    def __init__(self, kind: PythonKind, cfg: Any, main: bool) -> None:
        from pcsd.envs.pypool import EnvWorkers

        super().__init__(kind, cfg)
        train_f, eval_f = factories(cfg)
        self.factory = train_f
        self.train_tasks = train_seeds(max(64, cfg.rollout.tasks_per_step * max(cfg.optim.steps, 1)))
        self.eval_pool = eval_seeds(int(cfg.eval.episodes))
        timeout = float(cfg.env.step_timeout)
        threshold = float(cfg.env.success_threshold)
        self.train_workers = EnvWorkers(train_f, cfg.env.num_threads, step_timeout=timeout)
        self.eval_workers = EnvWorkers(eval_f, cfg.env.num_threads, step_timeout=timeout) if main else None
        self.split = f"{kind.name} {self.train_workers.describe}"
        self._train = PythonPools(kind, self.train_workers, success_threshold=threshold, step_timeout=timeout)
        self._eval = (
            PythonPools(kind, self.eval_workers, success_threshold=threshold, step_timeout=timeout)
            if self.eval_workers is not None
            else None
        )

    @property
    def train_pools(self) -> Pools:
        return self._train

    @property
    def eval_pools(self) -> Pools:
        if self._eval is None:
            raise RuntimeError("the evaluation envs run on rank 0 only")
        return self._eval

    def eval_tasks(self, index: int) -> list[Any]:
        return list(self.eval_pool)  # fixed seeds, the same at every evaluation

    def no_expert(self) -> Optional[str]:
        if env_check(self.factory, float(self.cfg.env.step_timeout)).has_expert:
            return None
        return f"{self.train_workers.describe} has no expert_action() to learn from"

    def warmup(self, count: int, *, skills: Any) -> Warmup:
        """The env's own ``expert_action()`` on ``count`` warm-up seeds; with
        ``optim.sft_teacher_demos=skills`` the student's examples from ``expert_action(privileged=False)``
        and the teacher's from ``expert_action(privileged=True)`` (the same seeds)."""
        from pcsd.envs.pypool import PythonEnvPool, play_experts

        cfg = self.cfg
        if self.no_expert() is not None:
            return Warmup()
        split = cfg.optim.get("sft_teacher_demos", "same") == "skills"

        def play(privileged: Optional[bool]) -> list[Any]:
            with PythonEnvPool(
                self.train_workers,
                count,
                seeds=sft_seeds(count),
                max_steps=cfg.env.max_steps,
                success_threshold=float(cfg.env.success_threshold),
            ) as pool:
                return play_experts(pool, privileged)

        if not split:
            return Warmup(play(None))
        out = Warmup(play(False), teacher_episodes=play(True))
        for who, eps in (("student", out.episodes), ("teacher", out.teacher_episodes or [])):
            out.summary[f"sft_{who}_expert_success"] = 100.0 * sum(ep.won for ep in eps) / max(len(eps), 1)
        return out

    def demonstrations(self, episodes: list[Any]) -> list[Any]:
        if self.cfg.optim.get("sft_teacher_demos", "same") == "skills":
            return episodes  # the blind expert's every episode: its won ones would show the rule it cannot read
        won = [ep for ep in episodes if ep.won]
        return won or episodes

    def tokenizer_corpus(self, episodes: list[Any]) -> list[str]:
        if episodes:
            return []
        from pcsd.envs.pypool import PythonEnvPool

        # no expert: the tokenizer learns the envs' first pages
        with PythonEnvPool(self.train_workers, min(64, len(self.train_tasks)), seeds=self.train_tasks[:64]) as pool:
            return corpus_of_resets(pool)

    def close(self) -> None:
        for workers in (self.train_workers, self.eval_workers):
            if workers is not None:
                workers.close()


GYM = PythonKind(
    "gym",
    "Gymnasium",
    "any Python text env: env.entry_point=module:Class or env.id=<Gymnasium id>, env.kwargs",
    _gym_factory,
    (_ENTRY, _ID),
)
TEXTARENA = PythonKind(
    "textarena",
    "TextArena",
    "a single-player TextArena game: env.id=<game id>, env.kwargs (the game's arguments)",
    _textarena_factory,
    (_ID,),
)
OPENENV = PythonKind(
    "openenv",
    "OpenEnv",
    "an OpenEnv environment server: env.url=<address> or env.kwargs.start=<module:app>",
    _openenv_factory,
    (_URL,),
)
