"""Every environment kind pcsd trains on, by the name ``env.name`` gives it: one registry.

A kind is an :class:`pcsd.envs.kind.EnvKind` (its config keys and checks, prompt family, pools,
task lists, warm-up, evaluation and table); the built-in ones are :data:`pcsd.envs.kinds.BUILTIN`:
``alfworld`` (the native ALFWorld engine, the default), ``webshop`` (the native WebShop),
``dummy`` (the native pool's deterministic test game: not a choice of ``env.name``), and the Python
text environments in worker processes: ``gym`` (any env of the protocol), ``textarena``,
``openenv``. The trainer's config schema, its choices of ``env.name`` and ``pcsd.eval``'s
``--split`` values all come from here (:func:`config_keys`, :func:`choices`, :func:`for_split`).

A new kind is a module in :mod:`pcsd.envs.kinds` and one :func:`register` call (its line in
``BUILTIN``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pcsd.envs.kind import EnvKind, Key
from pcsd.envs.kinds import BUILTIN
from pcsd.envs.kinds.text import _SERVED as _SERVED  # OpenEnv servers this process started (env.kwargs.start)

__all__ = ["EnvKind", "available", "choices", "config_keys", "default", "for_split", "get", "kinds", "register"]

_REGISTRY: dict[str, EnvKind] = {}


def register(kind: EnvKind) -> EnvKind:
    """Adds a kind (a name already registered is a ValueError)."""
    if not kind.name or kind.name in _REGISTRY:
        raise ValueError(f"env kind {kind.name!r} is registered already" if kind.name else "env kind: no name")
    if kind.task_score not in ("won", "score"):
        raise ValueError(f"task_score: expected 'won' or 'score', got {kind.task_score!r}")
    if kind.prompt not in ("alfworld", "webshop", "text"):
        raise ValueError(f"prompt: expected 'alfworld', 'webshop' or 'text', got {kind.prompt!r}")
    for k in kind.keys:  # a key shared by kinds means the same thing in each
        for other in _REGISTRY.values():
            same = next((o for o in other.keys if o.dotted == k.dotted), None)
            if same is not None and (same.type, same.default, same.choices) != (k.type, k.default, k.choices):
                raise ValueError(f"{k.dotted}: env kind {kind.name!r} declares it unlike {other.name!r}")
    _REGISTRY[kind.name] = kind
    return kind


def get(name: str) -> EnvKind:
    """The kind called ``name``; ValueError listing the kinds for an unknown one."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"env.name={name!r} is not an environment kind; choose one of {', '.join(choices())}"
        ) from None


def available() -> list[str]:
    """Every registered kind's name (the test game included)."""
    return list(_REGISTRY)


def kinds() -> list[EnvKind]:
    return list(_REGISTRY.values())


def choices() -> tuple[str, ...]:
    """The values ``env.name`` may take."""
    return tuple(k.name for k in _REGISTRY.values() if k.configurable)


def default() -> EnvKind:
    """The kind of a config that names none (the first registered)."""
    return next(iter(_REGISTRY.values()))


def config_keys(where: str = "env") -> list[Key]:
    """The keys the kinds own in the config group ``where``, each once, in registration order."""
    out: dict[str, Key] = {}
    for kind in _REGISTRY.values():
        for k in kind.keys:
            if k.where == where:
                out.setdefault(k.name, k)
    return list(out.values())


def owners(dotted: str) -> list[EnvKind]:
    """The configurable kinds that own the key ``dotted`` (``env.rooms``)."""
    return [k for k in _REGISTRY.values() if k.configurable and any(o.dotted == dotted for o in k.keys)]


def for_split(split: str) -> EnvKind:
    """The kind whose evaluation plays ``python -m pcsd.eval --split split``."""
    for kind in _REGISTRY.values():
        if split in kind.eval_splits:
            return kind
    raise ValueError(f"split={split!r} is unknown: expected one of {', '.join(eval_splits())}")


def eval_splits() -> tuple[str, ...]:
    out: list[str] = []
    for kind in _REGISTRY.values():
        out += [s for s in kind.eval_splits if s not in out]
    return tuple(out)


def foreign_key_problem(kind: EnvKind, values: Mapping[str, Any]) -> str | None:
    """The first key of another kind that ``values`` (dotted key -> value) sets away from its
    default, as one line naming it, or None."""
    own = {k.dotted for k in kind.keys}
    for key in config_keys("env") + config_keys("eval"):
        if key.dotted in own or values.get(key.dotted, key.default) == key.default:
            continue
        theirs = owners(key.dotted)
        if all(o.python for o in theirs):
            if kind.python:
                mine = ", ".join(k.dotted for k in kind.keys if k.name in ("entry_point", "id", "url", "kwargs"))
                return f"{key.dotted} is not a setting of env.name={kind.name} (its keys: {mine})"
            phrase = f"a setting of the Python environments (env.name={', '.join(o.name for o in theirs)})"
            return f"{key.dotted} is {phrase}; env.name={kind.name} has none"
        titles = [o.title for o in (_natives() if kind.python else theirs)]
        name = " / ".join(titles)
        article = "an" if name[:1] in "AEIOU" else "a"
        return (
            f"{key.dotted} is {article} {name} setting; env.name={kind.name} has none (leave it {_yaml(key.default)})"
        )
    return None


def _natives() -> list[EnvKind]:
    return [k for k in _REGISTRY.values() if k.configurable and not k.python]


def _yaml(v: Any) -> str:
    return "null" if v is None else f"{v:g}" if isinstance(v, float) else str(v)


for _kind in BUILTIN:
    register(_kind)
