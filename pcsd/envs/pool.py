"""The batched parallel environment pool (native, ``pcsd._envpool.EnvPool``), with typed results.

``num_envs`` text environments are stepped on the pool's own native thread pool with the GIL
released. Two ways to drive it, after sail-sg/envpool:

* **Synchronous**: :meth:`EnvPool.reset` / :meth:`EnvPool.step` take one request per env id and
  return a :class:`StepBatch` in the order of the ids.
* **Asynchronous**: :meth:`EnvPool.send` queues steps and returns at once; :meth:`EnvPool.recv`
  waits for the first ``batch_size`` requests to finish and returns them in completion order (use
  ``batch.env_id`` to know which envs they are). Each env has at most one request outstanding.

Groups (GRPO): env ``i`` plays game ``i // group_size``; the ``group_size`` envs of a group share the
game and its seed.

WebShop (``kind="webshop"``): ``shop=`` a loaded :class:`pcsd.envs.webshop.WebShop` (shared
read-only by every env) and ``goals=`` one goal index per group; ``admissible`` holds the page's
clickables, ``has_search_bar`` whether ``search[...]`` is offered, ``score`` the purchase reward
(0 until ``buy now``), ``won`` ``done and score == 1.0``. A step where the original WebShop raises
(see :mod:`pcsd.envs.webshop`) is that env's ``error`` and ends its episode. The paper's step limit
is ``max_steps=15``.

Auto-reset (``auto_reset=True``, envpool's rule): the step that ends an episode returns the final
observation with ``done`` set; the env's *next* step ignores its action, resets the env and returns
the reset observation (reward 0, step_count 0). With ``auto_reset=False`` (pcsd's rollouts) finished
envs leave the batch: stepping them is reported as an error for that env until :meth:`reset`.

Step limit: with ``max_steps`` set, a step that brings an episode to ``max_steps`` steps while the
game is still going returns ``done=True, truncated=True`` (``won`` as the game says).

Errors: a bad request for one env (an env id out of range, a step for a finished env with
auto-reset off, a panic inside the env) comes back in that env's ``error`` field with ``done`` set;
the other envs and the pool carry on, and a panicked env is broken until it is reset. An action
that is not valid text (a ``str`` holding a lone surrogate such as ``"\ud800"``) is that env's error
and is not sent to the env. A malformed
call (lengths differ, an id twice in one call, an env with a request outstanding, ``recv`` with
nothing pending) raises ValueError naming the argument, and changes nothing.

Ctrl-C while a call waits raises KeyboardInterrupt; the requests stay outstanding and ``recv()``
returns them later. A pool does not survive ``os.fork()``: in a child process, create a new one.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional

import numpy as np

from pcsd import _native

if TYPE_CHECKING:
    from pcsd.envs.procedural import ProceduralGame

__all__ = ["ENV_KINDS", "EnvKind", "EnvPool", "MAX_ENVS", "StepBatch"]


@dataclass(frozen=True)
class StepBatch:
    """Results of one call, one entry per env, as parallel lists / numpy arrays.

    ``error`` is ``""`` for envs whose request succeeded; an entry with an error has ``done`` set,
    empty ``obs`` and ``admissible``, and reward 0.
    """

    env_id: np.ndarray  # int64
    obs: list[str]
    admissible: list[list[str]]
    reward: np.ndarray  # float64, score delta of this step (0 on reset)
    score: np.ndarray  # float64
    done: np.ndarray  # bool
    won: np.ndarray  # bool
    truncated: np.ndarray  # bool, done because the step limit was hit
    task_type: list[str]
    step_count: np.ndarray  # int64, steps in the current episode
    error: list[str]
    has_search_bar: np.ndarray  # bool, WebShop: search[...] is offered (False for the other kinds)
    #: per env, the env's privileged text for the teacher ("" none; a Python env's
    #: ``info["privileged"]``, the latest given); None: the kind gives none (the native envs)
    privileged: Optional[list[str]] = None
    # Python envs: info["anchor"] per entry (None where the env gave none); None for native envs, whose
    # observations are their anchors (GiGPO's step-level groups)
    anchor: Optional[list[Optional[str]]] = None

    @classmethod
    def _from_columns(cls, cols: tuple[Any, ...]) -> StepBatch:
        """From the native columns: lists of str, and numeric columns as ``bytearray``s in native
        byte order (viewed, not copied; a bytearray keeps the arrays writable)."""
        (env_id, obs, adm, reward, score, done, won, trunc, task_type, steps, error, search_bar) = cols
        return cls(
            env_id=np.frombuffer(env_id, dtype=np.int64),
            obs=obs,
            admissible=adm,
            reward=np.frombuffer(reward, dtype=np.float64),
            score=np.frombuffer(score, dtype=np.float64),
            done=np.frombuffer(done, dtype=np.bool_),
            won=np.frombuffer(won, dtype=np.bool_),
            truncated=np.frombuffer(trunc, dtype=np.bool_),
            task_type=task_type,
            step_count=np.frombuffer(steps, dtype=np.uint32).astype(np.int64),
            error=error,
            has_search_bar=np.frombuffer(search_bar, dtype=np.bool_),
        )

    def __len__(self) -> int:
        return len(self.obs)

    @property
    def ok(self) -> np.ndarray:
        """Per env: the request succeeded (``error == ""``)."""
        return np.array([not e for e in self.error], dtype=bool)


@dataclass(frozen=True)
class _Option:
    doc: str
    check: Callable[[Any], bool]
    expected: str


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


@dataclass(frozen=True)
class EnvKind:
    """One kind of env the native pool can build."""

    name: str
    description: str
    #: Whether the kind plays game files (``games=[...]``, one per group).
    needs_games: bool
    #: Extra keyword options ``EnvPool(..., **env_kwargs)`` accepts for this kind.
    options: Mapping[str, _Option] = field(default_factory=dict)


ENV_KINDS: dict[str, EnvKind] = {
    "dummy": EnvKind(
        name="dummy",
        description="deterministic test game: say the direction the observation asks for",
        needs_games=False,
        options={
            "episode_len": _Option("steps per episode", lambda v: _is_int(v) and v >= 1, "an int >= 1"),
            "busy_iters": _Option(
                "CPU work per step (integer-mixing iterations)", lambda v: _is_int(v) and v >= 0, "an int >= 0"
            ),
            "panic_at_step": _Option(
                "make every env panic at this step (tests)",
                lambda v: v is None or (_is_int(v) and v >= 1),
                "None or an int >= 1",
            ),
        },
    ),
    "alfworld": EnvKind(
        name="alfworld",
        description="the native ALFWorld engine; games are game.tw-pddl paths",
        needs_games=True,
    ),
    "webshop": EnvKind(
        name="webshop",
        description="the native WebShop; shop=<pcsd.envs.webshop.WebShop>, goals=[goal index per group]",
        needs_games=False,
    ),
}

#: Most envs one pool holds (a larger ``num_envs`` is refused before anything is allocated).
MAX_ENVS = 1 << 20


def _env_ids(env_ids: Iterable[Any], arg: str = "env_ids") -> list[int]:
    if isinstance(env_ids, np.ndarray) and env_ids.dtype.kind in "iu":
        if env_ids.ndim != 1:
            raise ValueError(f"{arg}: expected a 1-d array of ints, got shape {env_ids.shape}")
        if env_ids.dtype.kind == "u" and env_ids.size and env_ids.max() > np.iinfo(np.int64).max:
            raise ValueError(f"{arg}: env ids must fit in int64")
        return env_ids.astype(np.int64).tolist()
    if type(env_ids) is list and set(map(type, env_ids)) <= {int}:
        return env_ids  # plain ints (the common case, checked in C): the native call takes them as they are
    if isinstance(env_ids, (str, bytes)):
        raise ValueError(f"{arg}: expected a sequence of ints, got {type(env_ids).__name__}")
    try:
        items = list(env_ids)
    except TypeError:
        raise ValueError(f"{arg}: expected a sequence of ints, got {type(env_ids).__name__}") from None
    out = []
    for k, x in enumerate(items):
        if isinstance(x, (bool, np.bool_)):
            raise ValueError(f"{arg}[{k}]: expected an int, got bool")
        try:
            out.append(operator.index(x))
        except TypeError:
            raise ValueError(f"{arg}[{k}]: expected an int, got {type(x).__name__}") from None
    return out


def _call(fn: Callable[..., Any], *args: Any, arg: str = "env_ids") -> Any:
    """A native call taking env ids: an id beyond int64 (the native type) is a ValueError like any
    other bad id, not the OverflowError of the conversion."""
    try:
        return fn(*args)
    except OverflowError:
        raise ValueError(f"{arg}: env ids must fit in int64 (|id| < 2**63); the pool's ids are 0..num_envs-1") from None


def _actions(actions: Iterable[Any]) -> list[str]:
    if type(actions) is list and set(map(type, actions)) <= {str}:
        return actions  # plain strs (the common case, checked in C)
    if isinstance(actions, (str, bytes)):
        raise ValueError("actions: expected a sequence of str (one per env), got a single str")
    try:
        items = list(actions)
    except TypeError:
        raise ValueError(f"actions: expected a sequence of str, got {type(actions).__name__}") from None
    for k, a in enumerate(items):
        if not isinstance(a, str):
            raise ValueError(f"actions[{k}]: expected str, got {type(a).__name__}")
    return items


def _game_arg(k: int, game: Any) -> str | tuple[str, str]:
    """A game of an ALFWorld pool for the native side: a file path, or ``(name, text)`` for a
    :class:`pcsd.envs.procedural.ProceduralGame` (generated now, never written to disk)."""
    from pcsd.envs.procedural import ProceduralGame

    if isinstance(game, ProceduralGame):
        return game.name, game.text()
    try:
        path = os.fspath(game)
    except TypeError:
        raise ValueError(
            f"games[{k}]: expected a game file path or a ProceduralGame, got {type(game).__name__}"
        ) from None
    if not os.path.isfile(path):
        raise ValueError(f"games[{k}]: no such game file: {path}")
    return os.fsdecode(path)


def _int_arg(name: str, v: Any, minimum: int) -> int:
    if not _is_int(v) or v < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {v!r}")
    return int(v)


class EnvPool:
    """A batched pool of ``num_envs`` text environments stepped on native threads.

    Args:
        kind: env kind, a key of :data:`ENV_KINDS` (``"dummy"``; ``"alfworld"`` once built in).
        num_envs: number of envs; a multiple of ``group_size``.
        group_size: envs per game (GRPO group); env ``i`` plays game ``i // group_size``.
        games: for kinds that play game files, one per group (``num_envs // group_size``): a path,
            or a :class:`pcsd.envs.procedural.ProceduralGame` (generated here, no file).
        max_steps: per-episode step limit (``truncated`` when hit); ``None``: no limit.
        num_threads: worker threads; 0 uses one per core.
        auto_reset: the auto-reset rule (see the module docs); off: finished envs wait for ``reset``.
        seed: base seed; group ``g`` gets ``seed + g`` (kinds with seeded games).
        **env_kwargs: the kind's options (``ENV_KINDS[kind].options``).
    """

    def __init__(
        self,
        kind: str,
        num_envs: int,
        *,
        group_size: int = 1,
        games: Sequence[str | os.PathLike[str] | ProceduralGame] | None = None,
        max_steps: int | None = 50,
        num_threads: int = 0,
        auto_reset: bool = False,
        seed: int = 0,
        **env_kwargs: Any,
    ) -> None:
        if kind not in ENV_KINDS:
            raise ValueError(f"kind: unknown env kind {kind!r}; known kinds: {sorted(ENV_KINDS)}")
        spec = ENV_KINDS[kind]
        num_envs = _int_arg("num_envs", num_envs, 1)
        if num_envs > MAX_ENVS:
            raise ValueError(f"num_envs: at most {MAX_ENVS} envs per pool, got {num_envs}")
        group_size = _int_arg("group_size", group_size, 1)
        if num_envs % group_size:
            raise ValueError(f"num_envs: must be a multiple of group_size ({group_size}), got {num_envs}")
        num_groups = num_envs // group_size
        game_paths: list[str | tuple[str, str]] | None = None
        if spec.needs_games:
            if games is None or isinstance(games, (str, bytes)):
                raise ValueError(f"games: env kind {kind!r} needs a list of game file paths, one per group")
            game_list = list(games)
            if len(game_list) != num_groups:
                raise ValueError(
                    f"games: expected one game per group ({num_envs} envs / group_size {group_size} = "
                    f"{num_groups}), got {len(game_list)}"
                )
            game_paths = [_game_arg(k, g) for k, g in enumerate(game_list)]
        elif games is not None:
            raise ValueError(f"games: env kind {kind!r} plays no game files; pass games=None")
        native_shop = None
        goal_list: list[int] | None = None
        if kind == "webshop":
            from pcsd.envs.webshop import WebShop

            shop = env_kwargs.pop("shop", None)
            goals = env_kwargs.pop("goals", None)
            if not isinstance(shop, WebShop):
                raise ValueError(f"shop: env kind 'webshop' needs shop=<a loaded WebShop>, got {type(shop).__name__}")
            if goals is None or isinstance(goals, (str, bytes)):
                raise ValueError("goals: env kind 'webshop' needs a list of goal indices, one per group")
            goal_list = _env_ids(goals, "goals")
            if len(goal_list) != num_groups:
                raise ValueError(
                    f"goals: expected one goal index per group ({num_envs} envs / group_size {group_size} = "
                    f"{num_groups}), got {len(goal_list)}"
                )
            for gi, goal in enumerate(goal_list):
                if not 0 <= goal < shop.num_goals:
                    raise ValueError(f"goals[{gi}]: expected a goal index in [0, {shop.num_goals}), got {goal}")
            native_shop = shop.native
        if max_steps is None:
            native_max_steps = 0
        else:
            native_max_steps = _int_arg("max_steps", max_steps, 1)
        num_threads = _int_arg("num_threads", num_threads, 0)
        seed = _int_arg("seed", seed, 0)
        if not isinstance(auto_reset, (bool, np.bool_)):
            raise ValueError(f"auto_reset: expected a bool, got {auto_reset!r}")
        for key, value in env_kwargs.items():
            opt = spec.options.get(key)
            if opt is None:
                known = ", ".join(sorted(spec.options)) or "none"
                raise ValueError(f"{key}: not an option of env kind {kind!r} (its options: {known})")
            if not opt.check(value):
                raise ValueError(f"{key}: expected {opt.expected}, got {value!r}")
        native = _native.require("_envpool")
        self._pool = native.EnvPool(
            kind,
            num_envs,
            group_size=group_size,
            games=game_paths,
            max_steps=native_max_steps,
            num_threads=num_threads,
            auto_reset=bool(auto_reset),
            seed=seed,
            options={k: (None if v is None else int(v)) for k, v in env_kwargs.items()},
            shop=native_shop,
            goals=goal_list,
        )
        self._kind = kind
        self._max_steps = max_steps

    # ---- properties ----
    @property
    def kind(self) -> str:
        return self._kind

    @property
    def num_envs(self) -> int:
        return int(self._pool.num_envs)

    @property
    def num_games(self) -> int:
        return int(self._pool.num_games)

    @property
    def group_size(self) -> int:
        return int(self._pool.group_size)

    @property
    def num_threads(self) -> int:
        """Worker threads actually running."""
        return int(self._pool.num_threads)

    @property
    def max_steps(self) -> int | None:
        return self._max_steps

    @property
    def auto_reset(self) -> bool:
        return bool(self._pool.auto_reset)

    @property
    def outstanding(self) -> int:
        """Requests sent and not yet received."""
        return int(self._pool.outstanding)

    @property
    def in_flight(self) -> int:
        """Requests still being worked on (outstanding minus those ready to be received)."""
        return int(self._pool.in_flight)

    @property
    def closed(self) -> bool:
        return bool(self._pool.closed)

    def __len__(self) -> int:
        return self.num_envs

    # ---- calls ----
    def reset(self, env_ids: Iterable[int] | None = None) -> StepBatch:
        """Resets the given envs (default: all) and returns their first observations, in id order."""
        ids = list(range(self.num_envs)) if env_ids is None else _env_ids(env_ids)
        return StepBatch._from_columns(_call(self._pool.reset, ids))

    def step(self, actions: Sequence[str], env_ids: Iterable[int] | None = None) -> StepBatch:
        """Steps each env id with its action (default ids: ``0..len(actions)``, which must be all
        envs) and returns the results in the order of the ids."""
        acts = _actions(actions)
        if env_ids is None:
            if len(acts) != self.num_envs:
                raise ValueError(
                    f"actions: without env_ids, expected one action per env ({self.num_envs}), got {len(acts)}"
                )
            ids = list(range(self.num_envs))
        else:
            ids = _env_ids(env_ids)
        return StepBatch._from_columns(_call(self._pool.step, acts, ids))

    def send(self, actions: Sequence[str], env_ids: Iterable[int]) -> None:
        """Queues a step for each env id and returns at once; collect the results with :meth:`recv`."""
        _call(self._pool.send, _actions(actions), _env_ids(env_ids))

    def send_reset(self, env_ids: Iterable[int]) -> None:
        """Queues a reset for each env id and returns at once."""
        _call(self._pool.send_reset, _env_ids(env_ids))

    def recv(self, batch_size: int | None = None) -> StepBatch:
        """Waits for the first ``batch_size`` outstanding requests to finish (default: all
        outstanding) and returns them in completion order."""
        if batch_size is not None:
            batch_size = _int_arg("batch_size", batch_size, 1)
        return StepBatch._from_columns(self._pool.recv(batch_size))

    def task_of(self, env_id: int) -> tuple[str, str]:
        """``(task_type, task description)`` of one env."""
        return tuple(_call(self._pool.task_of, _env_ids([env_id], "env_id")[0], arg="env_id"))

    def close(self) -> None:
        """Stops the pool; requests not yet started are dropped. Later calls raise RuntimeError."""
        self._pool.close()

    def __enter__(self) -> EnvPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if self.closed:
            return f"EnvPool(kind={self._kind!r}, closed)"
        return (
            f"EnvPool(kind={self._kind!r}, num_envs={self.num_envs}, group_size={self.group_size}, "
            f"num_threads={self.num_threads}, max_steps={self._max_steps}, auto_reset={self.auto_reset})"
        )
