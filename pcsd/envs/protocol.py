"""The text-environment protocol: any Python environment pcsd trains on.

An environment is an object with Gymnasium's two methods, on text::

    reset(*, seed: int | None = None, options: dict | None = None) -> (observation: str, info: dict)
    step(action: str) -> (observation: str, reward: float, terminated: bool, truncated: bool, info: dict)

``info`` keys pcsd reads (all optional, except that the task falls back to the first observation):

==========================  =====================================================================
``"task"`` (str)            the task: goes into the prompt and selects the teacher's skills (read at
                            ``reset``; without it the first observation is the task)
``"admissible_actions"``    list of str, the valid actions now (at ``reset`` and after every step);
                            with it, an action outside the list counts as invalid, as for ALFWorld
``"won"`` (bool)            success, when the env knows it (else success = the episode's summed
                            reward >= the success threshold, ``env.success_threshold``)
``"task_type"`` (str)       the task's type, for task-type skills (``<task_type>.md``)
``"privileged"`` (str)      what a privileged teacher should know and the student must not (the
                            hidden target, the map, the solution): the teacher's prompt shows it
                            (beside the skills), the student's never; read at ``reset`` and replaced
                            whenever a step's info gives it (``""`` clears it)
``"anchor"`` (str)          the state as GiGPO's step-level groups compare it (``algo.estimator=
                            gigpo``): the current observation without history; without it, the
                            observation itself (read at ``reset`` and after every step)
==========================  =====================================================================

Every text pcsd reads (the observation, the task, the actions, ...) must be valid Unicode text:
a string that cannot be encoded as UTF-8 (a lone surrogate such as ``"\ud800"``) is outside the
protocol, that env's error like any other.

Optional methods: ``expert_action(self) -> str`` (the next action of an expert, for the warm-up's
demonstrations) and ``close(self) -> None``. Any ``gymnasium.Env`` whose observations and actions
are text (``gymnasium.spaces.Text``) follows the protocol as it is.

:class:`EnvFactory` names an environment the way the config does (``env.entry_point=module:Class``
or ``env.id=<Gymnasium id>``, with ``env.kwargs``) and builds it; it is what worker processes
receive (:mod:`pcsd.envs.pypool`). :func:`read_reset` / :func:`read_step` check one call's result
against the protocol and keep what pcsd reads (:class:`Observation`), with one-line messages naming
what is wrong (:class:`ProtocolError`); :func:`check_reset` / :func:`check_step` are the same checks
returning plain tuples (the worker processes' fast path).
"""

from __future__ import annotations

import importlib
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

__all__ = [
    "EnvBuildError",
    "EnvFactory",
    "INFO_KEYS",
    "Observation",
    "ProtocolError",
    "check_reset",
    "check_step",
    "load_entry_point",
    "read_reset",
    "read_step",
]

#: the ``info`` keys pcsd reads
INFO_KEYS = ("task", "admissible_actions", "won", "task_type", "privileged", "anchor")


class ProtocolError(ValueError):
    """An environment's call returned something outside the protocol (one line says what)."""


class EnvBuildError(ValueError):
    """An environment could not be built; ``stage`` is ``"import"`` (the entry point or id) or
    ``"construct"`` (the constructor raised, e.g. on a bad keyword argument)."""

    def __init__(self, stage: str, message: str) -> None:
        super().__init__(message)
        self.stage = stage


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def load_entry_point(entry_point: str) -> Callable[..., Any]:
    """The callable ``module:attr`` names (``attr`` may be dotted), importing ``module``."""
    if not isinstance(entry_point, str) or entry_point.count(":") != 1:
        raise EnvBuildError("import", f"expected 'module:Class' (e.g. my_envs:GuessEnv), got {entry_point!r}")
    mod_name, attr = entry_point.split(":")
    if not mod_name or not attr:
        raise EnvBuildError("import", f"expected 'module:Class' (e.g. my_envs:GuessEnv), got {entry_point!r}")
    try:
        obj: Any = importlib.import_module(mod_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or mod_name
        where = (
            "the current folder or the installed packages"
            if missing == mod_name.split(".")[0]
            else f"the packages {mod_name} imports"
        )
        raise EnvBuildError(
            "import",
            f"no module named {missing!r} in {where} (install the package that "
            f"provides it, or run from the folder that holds it)",
        ) from None
    except Exception as exc:  # the user's module raised while importing
        raise EnvBuildError("import", f"importing {mod_name} raised {_first_line(exc)}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise EnvBuildError("import", f"module {mod_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise EnvBuildError("import", f"{entry_point} is a {type(obj).__name__}, not a class or function")
    return obj


@dataclass(frozen=True)
class EnvFactory:
    """Builds one environment: ``entry_point`` (``"module:Class"``, called with ``kwargs``) or
    ``id`` (``gymnasium.make(id, **kwargs)``; ``"module:Id-v0"`` imports ``module`` first, where the
    id is registered). Picklable, so worker processes receive it and build their own envs.

    ``wrap`` (optional, ``"module:function"``): applied to the built env, e.g. an adapter from
    another API to this protocol. ``label`` (optional): what :meth:`describe` calls the env (the
    TextArena kind: the game id) instead of the entry point and its arguments."""

    entry_point: Optional[str] = None
    id: Optional[str] = None
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    wrap: Optional[str] = None
    label: Optional[str] = None

    def __post_init__(self) -> None:
        if (self.entry_point is None) == (self.id is None):
            raise ValueError("EnvFactory: give exactly one of entry_point ('module:Class') and id (a Gymnasium id)")
        if not isinstance(self.kwargs, Mapping):
            raise ValueError(f"kwargs: expected a mapping, got {type(self.kwargs).__name__}")
        object.__setattr__(self, "kwargs", dict(self.kwargs))

    def describe(self) -> str:
        if self.label is not None:
            return self.label
        what = self.entry_point if self.entry_point is not None else f"gymnasium.make({self.id!r})"
        return what + (f" with {dict(self.kwargs)}" if self.kwargs else "")

    def __call__(self) -> Any:
        if self.entry_point is not None:
            make = load_entry_point(self.entry_point)
            try:
                env = make(**self.kwargs)
            except TypeError as exc:
                raise EnvBuildError("construct", f"{self.entry_point}(**kwargs) raised {_first_line(exc)}") from None
            except Exception as exc:
                raise EnvBuildError("construct", f"{self.entry_point}() raised {_first_line(exc)}") from None
        else:
            env = _gym_make(str(self.id), self.kwargs)
        if self.wrap is not None:
            env = load_entry_point(self.wrap)(env)
        return env


def _gym_make(env_id: str, kwargs: Mapping[str, Any]) -> Any:
    try:
        import gymnasium
    except ImportError:
        raise EnvBuildError("import", "a Gymnasium id needs the gymnasium package (pip install 'pcsd[gym]')") from None
    try:
        return gymnasium.make(env_id, **kwargs)
    except gymnasium.error.Error as exc:  # unregistered id, bad version, module in the id not found
        raise EnvBuildError("import", f"gymnasium.make({env_id!r}): {_first_line(exc)}") from None
    except ModuleNotFoundError as exc:
        raise EnvBuildError("import", f"gymnasium.make({env_id!r}): no module named {exc.name!r}") from None
    except TypeError as exc:
        raise EnvBuildError("construct", f"gymnasium.make({env_id!r}, **kwargs) raised {_first_line(exc)}") from None
    except Exception as exc:
        raise EnvBuildError("construct", f"gymnasium.make({env_id!r}) raised {_first_line(exc)}") from None


@dataclass
class Observation:
    """One call's result as pcsd reads it (``reward`` 0 and ``done`` false at reset)."""

    obs: str
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    task: Optional[str] = None  # info["task"] (reset)
    admissible: Optional[list[str]] = None  # info["admissible_actions"]
    won: Optional[bool] = None  # info["won"]
    task_type: Optional[str] = None  # info["task_type"]
    privileged: Optional[str] = None  # info["privileged"]
    anchor: Optional[str] = None  # info["anchor"]


def _type(v: Any) -> str:
    return type(v).__name__


def _is_bool(v: Any) -> bool:
    return type(v) is bool or type(v).__name__ == "bool_"  # numpy.bool_ without importing numpy


def _info(where: str, info: Any) -> tuple:
    """``(task, admissible, won, task_type, privileged, anchor)`` of an info dict, checked."""
    if type(info) is not dict and not isinstance(info, Mapping):
        raise ProtocolError(f"{where} returned info of type {_type(info)}, expected a dict")
    task = info.get("task")
    if task is not None and (type(task) is not str or not task.strip()):
        if not isinstance(task, str) or not task.strip():
            raise ProtocolError(f"{where} returned info['task'] = {task!r:.60}, expected a non-empty str")
        task = str.__str__(task)
    adm = info.get("admissible_actions")
    if adm is not None:
        if type(adm) is not list or not all(type(a) is str for a in adm):
            if isinstance(adm, (str, bytes)) or not hasattr(adm, "__iter__"):
                raise ProtocolError(
                    f"{where} returned info['admissible_actions'] of type {_type(adm)}, expected a list of str"
                )
            adm = list(adm)
            for k, a in enumerate(adm):
                if not isinstance(a, str):
                    raise ProtocolError(
                        f"{where} returned info['admissible_actions'][{k}] of type {_type(a)}, expected str"
                    )
            adm = [str.__str__(a) for a in adm]
    won = info.get("won")
    if won is not None:
        if not _is_bool(won):
            raise ProtocolError(f"{where} returned info['won'] of type {_type(won)}, expected a bool")
        won = bool(won)
    tt = info.get("task_type")
    if tt is not None and type(tt) is not str:
        if not isinstance(tt, str):
            raise ProtocolError(f"{where} returned info['task_type'] of type {_type(tt)}, expected str")
        tt = str.__str__(tt)
    priv = info.get("privileged")
    if priv is not None and type(priv) is not str:
        if not isinstance(priv, str):
            raise ProtocolError(f"{where} returned info['privileged'] of type {_type(priv)}, expected str")
        priv = str.__str__(priv)
    anchor = info.get("anchor")
    if anchor is not None and type(anchor) is not str:
        if not isinstance(anchor, str):
            raise ProtocolError(f"{where} returned info['anchor'] of type {_type(anchor)}, expected str")
        anchor = str.__str__(anchor)
    return task, adm, won, tt, priv, anchor


def _check_text(
    where: str,
    obs: str,
    task: Optional[str],
    adm: Optional[list],
    tt: Optional[str],
    priv: Optional[str],
    anchor: Optional[str] = None,
) -> None:
    """Every text of one result must be valid Unicode (encodable as UTF-8): one check of all of them
    (the common case), then the one that is not, named."""
    try:
        "".join((obs, task or "", tt or "", priv or "", anchor or "", *(adm or ()))).encode("utf-8")
        return
    except UnicodeEncodeError:
        pass
    named = [("an observation", obs), ("info['task']", task), ("info['task_type']", tt), ("info['privileged']", priv)]
    named += [("info['anchor']", anchor)]
    named += [(f"info['admissible_actions'][{k}]", a) for k, a in enumerate(adm or ())]
    for what, text in named:
        try:
            (text or "").encode("utf-8")
        except UnicodeEncodeError as exc:
            bad = text[exc.start : exc.end] if text else ""
            raise ProtocolError(
                f"{where} returned {what} that is not valid text ({bad!r} at position {exc.start} cannot be "
                "encoded: a lone surrogate?), expected a str of Unicode characters"
            ) from None


def _text(where: str, obs: Any) -> str:
    if type(obs) is not str:
        if not isinstance(obs, str):
            raise ProtocolError(
                f"{where} returned an observation of type {_type(obs)}, expected str (pcsd trains "
                "on text environments: observations and actions are text)"
            )
        return str.__str__(obs)
    return obs


def check_reset(result: Any) -> tuple:
    """``env.reset(...)``'s result ``(observation, info)``, checked, as the tuple
    ``(obs, 0.0, False, False, task, admissible, won, task_type, privileged, anchor)``."""
    if type(result) is not tuple or len(result) != 2:
        raise ProtocolError(f"reset() returned {_shape(result)}, expected (observation, info)")
    obs, info = result
    text = _text("reset()", obs)
    task, adm, won, tt, priv, anchor = _info("reset()", info)
    _check_text("reset()", text, task, adm, tt, priv, anchor)
    return (text, 0.0, False, False, task, adm, won, tt, priv, anchor)


def check_step(result: Any) -> tuple:
    """``env.step(action)``'s result ``(observation, reward, terminated, truncated, info)``,
    checked, as the tuple ``(obs, reward, terminated, truncated, None, admissible, won, task_type,
    privileged, anchor)`` (the task is read at reset only)."""
    if type(result) is not tuple or len(result) != 5:
        hint = (
            " (the old Gym API's 4-tuple? Gymnasium splits done into terminated, truncated)"
            if (isinstance(result, tuple) and len(result) == 4)
            else ""
        )
        raise ProtocolError(
            f"step() returned {_shape(result)}, expected (observation, reward, terminated, truncated, info){hint}"
        )
    obs, reward, terminated, truncated, info = result
    if type(reward) is not float:
        if _is_bool(reward) or not isinstance(reward, numbers.Real):
            raise ProtocolError(f"step() returned a reward of type {_type(reward)}, expected a number")
        reward = float(reward)
    if not math.isfinite(reward):
        raise ProtocolError(f"step() returned the reward {reward}, expected a finite number")
    for name, v in (("terminated", terminated), ("truncated", truncated)):
        if type(v) is not bool and not _is_bool(v):
            raise ProtocolError(f"step() returned {name} of type {_type(v)}, expected a bool")
    _, adm, won, tt, priv, anchor = _info("step()", info)
    text = _text("step()", obs)
    _check_text("step()", text, None, adm, tt, priv, anchor)
    return (text, reward, bool(terminated), bool(truncated), None, adm, won, tt, priv, anchor)


def read_reset(result: Any) -> Observation:
    """Checks ``env.reset(...)``'s result ``(observation, info)`` (:func:`check_reset`)."""
    return Observation(*check_reset(result))


def read_step(result: Any) -> Observation:
    """Checks ``env.step(action)``'s result (:func:`check_step`)."""
    return Observation(*check_step(result))


def _shape(v: Any) -> str:
    return f"a tuple of {len(v)}" if isinstance(v, tuple) else f"a {_type(v)}"
