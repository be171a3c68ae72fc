"""Every environment pcsd trains on, by the name ``env.name`` gives it: one registry.

An :class:`EnvSpec` says how the rollout loop builds a pool of the env (:meth:`EnvSpec.make_pool`,
the same call for every kind), which prompt family renders its prompts (``prompt``: the
``PromptBuilder`` env of :mod:`pcsd.text.prompts`, ``alfworld``, ``webshop`` or ``text``), and the
two ways kinds differ in what an episode means:

* ``errors_end_episode``: an env error ends that episode (counted in the batch's ``env_errors``)
  instead of stopping the run (ALFWorld's engine: an error there is a bug, so it stops);
* ``env_reward``: the trajectory's reward is the env's own summed reward (Python envs) instead of
  ``algo.success_reward`` on a win (ALFWorld, WebShop: the paper's binary outcome);
* ``task_score``: what a finished episode's task score is: ``won`` (1/0, ALFWorld) or the pool's
  ``score`` (WebShop's purchase reward, a Python env's summed reward).

Native kinds (``alfworld``, ``webshop``, ``dummy``) run in :class:`pcsd.envs.pool.EnvPool`; Python
kinds (``gym``; ``textarena`` and ``openenv``, through the adapters :mod:`pcsd.envs.textarena` and
:mod:`pcsd.envs.openenv`) run in :class:`pcsd.envs.pypool.PythonEnvPool`, and their spec turns the
config's ``env`` section into a picklable :class:`pcsd.envs.protocol.EnvFactory`
(:meth:`EnvSpec.factory`; a package the kind needs and does not find is a ValueError naming the
key and the extra to install). ``env.name=openenv`` with ``env.kwargs.start=module:app`` serves
that app once per process (the first factory starts it on 127.0.0.1; the factories' envs, in any
worker process, connect to it; it stops when the process exits or dies). A new Python kind is a
module here plus one :func:`register` call.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Callable, Optional

from pcsd.envs.protocol import EnvFactory

__all__ = ["EnvSpec", "available", "get", "register"]


@dataclass(frozen=True)
class EnvSpec:
    """One kind of environment (see the module docs)."""

    name: str
    prompt: str
    description: str
    python: bool = False
    errors_end_episode: bool = True
    env_reward: bool = False
    task_score: str = "won"
    #: Python kinds: the config's ``env`` section -> the factory of one env (ValueError naming the key)
    make_factory: Optional[Callable[[Mapping[str, Any]], EnvFactory]] = None
    #: the ``env.*`` keys this kind reads besides the common ones (the others must stay unset)
    keys: tuple[str, ...] = ()

    def factory(self, env: Mapping[str, Any]) -> EnvFactory:
        """The factory of one env of this kind from the config's ``env`` section."""
        if self.make_factory is None:
            raise ValueError(f"env.name={self.name}: a native env, built by the pool itself")
        return self.make_factory(env)

    def make_pool(
        self,
        num_envs: int,
        group_size: int,
        games: Sequence[Any] | int,
        *,
        max_steps: int,
        num_threads: int = 0,
        seed: int = 0,
        options: Optional[Mapping[str, Any]] = None,
    ) -> Any:
        """A pool of ``num_envs`` envs of this kind, env ``i`` playing ``games[i // group_size]``:
        game files (ALFWorld), goal indices (WebShop, the shop in ``options["shop"]``), reset seeds
        (Python kinds: ``options["make_env"]`` is the factory or a running
        :class:`pcsd.envs.pypool.EnvWorkers`, plus the pool's ``success_threshold``,
        ``step_timeout`` and reset ``options``), or a count (``dummy``)."""
        opts = dict(options or {})
        if self.python:
            from pcsd.envs.pypool import PythonEnvPool

            if isinstance(games, int):
                raise ValueError(f"games: env kind {self.name!r} needs one reset seed per group, got a count")
            make_env = opts.pop("make_env", None)
            if make_env is None:
                raise ValueError(f"make_env: env kind {self.name!r} needs options['make_env'] (its factory or workers)")
            reset_options = opts.pop("reset_options", None)
            return PythonEnvPool(
                make_env,
                num_envs,
                group_size=group_size,
                seeds=list(games),
                max_steps=max_steps,
                num_workers=num_threads,
                options=reset_options,
                **opts,
            )
        from pcsd.envs.pool import EnvPool

        if self.name == "webshop":
            if isinstance(games, int):
                raise ValueError("games: env kind 'webshop' needs one goal index per group, got a count")
            opts["goals"] = list(games)
            files = None
        else:
            files = None if isinstance(games, int) else list(games)
        return EnvPool(
            self.name,
            num_envs,
            group_size=group_size,
            games=files,
            max_steps=max_steps,
            num_threads=num_threads,
            seed=seed,
            **opts,
        )


_REGISTRY: dict[str, EnvSpec] = {}


def register(spec: EnvSpec) -> EnvSpec:
    """Adds a kind (a name already registered is a ValueError)."""
    if spec.name in _REGISTRY:
        raise ValueError(f"env kind {spec.name!r} is registered already")
    if spec.task_score not in ("won", "score"):
        raise ValueError(f"task_score: expected 'won' or 'score', got {spec.task_score!r}")
    if spec.prompt not in ("alfworld", "webshop", "text"):
        raise ValueError(f"prompt: expected 'alfworld', 'webshop' or 'text', got {spec.prompt!r}")
    _REGISTRY[spec.name] = spec
    return spec


def get(name: str) -> EnvSpec:
    """The kind called ``name``; ValueError listing the kinds for an unknown one."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"env.name={name!r} is not an environment kind; choose one of {', '.join(available())}"
        ) from None


def available() -> list[str]:
    return list(_REGISTRY)


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


register(EnvSpec("alfworld", "alfworld", "the native ALFWorld engine (game files)", errors_end_episode=False))
register(EnvSpec("webshop", "webshop", "the native WebShop (goal indices of a loaded shop)", task_score="score"))
register(EnvSpec("dummy", "alfworld", "the native pool's deterministic test game", errors_end_episode=False))
register(
    EnvSpec(
        "gym",
        "text",
        "any Python text env: env.entry_point=module:Class or env.id=<Gymnasium id>, env.kwargs",
        python=True,
        env_reward=True,
        task_score="score",
        make_factory=_gym_factory,
        keys=("entry_point", "id", "kwargs"),
    )
)
register(
    EnvSpec(
        "textarena",
        "text",
        "a single-player TextArena game: env.id=<game id>, env.kwargs (the game's arguments)",
        python=True,
        env_reward=True,
        task_score="score",
        make_factory=_textarena_factory,
        keys=("id", "kwargs"),
    )
)
register(
    EnvSpec(
        "openenv",
        "text",
        "an OpenEnv environment server: env.url=<address> or env.kwargs.start=<module:app>",
        python=True,
        env_reward=True,
        task_score="score",
        make_factory=_openenv_factory,
        keys=("url", "kwargs"),
    )
)
