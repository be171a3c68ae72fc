"""Procedurally generated ALFWorld games: pcsd's default training games when no data is present.

The generator lives in Rust (``rust_envpool/src/alfworld_gen``) and writes games in the format of
the official ALFWorld 0.4.2 ``game.tw-pddl`` files (``pddl_domain``, ``grammar``,
``pddl_problem``, ``solvable``, ``walkthrough``), so the same file plays in the real ALFWorld
engine and in pcsd's native engine. Generation is seeded: the same ``(task_type, seed, knobs)``
always gives the same bytes.

Knobs (difficulty):
  room          one of :data:`ROOMS`; must be allowed for the task type (:func:`task_rooms`).
  receptacles   total number of receptacles; range per room from :func:`receptacle_range`.
  distractors   number of objects besides the task's own, ``0..MAX_DISTRACTORS``.
  usual_place   probability (default 0) that the task's object starts in its class's usual
                place (:func:`usual_places`), where the room has one.
Any knob left as ``None`` is drawn from values typical of the room.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from pcsd import _native

TASK_TYPES: tuple[str, ...] = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
ROOMS: tuple[str, ...] = ("kitchen", "livingroom", "bedroom", "bathroom")
MAX_DISTRACTORS = 60
GAME_FILENAME = "game.tw-pddl"

__all__ = [
    "GAME_FILENAME",
    "MAX_DISTRACTORS",
    "ROOMS",
    "TASK_TYPES",
    "generate_game_json",
    "receptacle_range",
    "task_rooms",
    "usual_places",
    "write_game",
    "write_games",
]


def _check_int(name: str, value: object, *, optional: bool) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        expected = "an int or None" if optional else "an int"
        raise TypeError(f"{name} must be {expected}, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name}={value} is out of range: expected a non-negative int")


def _check_task(task_type: object) -> str:
    if not isinstance(task_type, str) or task_type not in TASK_TYPES:
        raise ValueError(f"task_type={task_type!r} is unknown: expected one of {', '.join(TASK_TYPES)}")
    return task_type


def _check_room(room: object) -> str:
    if not isinstance(room, str) or room not in ROOMS:
        raise ValueError(f"room={room!r} is unknown: expected one of {', '.join(ROOMS)}")
    return room


def _native_call(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except ValueError as exc:
        # The Rust side names its config fields; report the Python argument names.
        msg = str(exc).replace("num_receptacles=", "receptacles=").replace("num_distractors=", "distractors=")
        raise ValueError(msg) from None


def task_rooms(task_type: str) -> tuple[str, ...]:
    """Rooms a task type can be set in (heat/cool: kitchen; clean: kitchen, bathroom; ...)."""
    mod = _native.require("_envpool")
    return tuple(_native_call(mod.gen_task_rooms, _check_task(task_type)))


def usual_places() -> dict[str, str]:
    """The generated houses' convention of where objects are kept (the ``usual_place`` knob):
    object class -> receptacle class, e.g. ``{"KeyChain": "Dresser", ...}``."""
    mod = _native.require("_envpool")
    return dict(mod.gen_usual_places())


def receptacle_range(room: str) -> tuple[int, int]:
    """Inclusive ``(min, max)`` of the ``receptacles`` knob in a room."""
    mod = _native.require("_envpool")
    return tuple(_native_call(mod.gen_receptacle_range, _check_room(room)))


def generate_game_json(
    task_type: str,
    seed: int,
    *,
    room: str | None = None,
    receptacles: int | None = None,
    distractors: int | None = None,
    usual_place: float = 0.0,
) -> str:
    """The text of a new ``game.tw-pddl`` file of ``task_type`` (one of :data:`TASK_TYPES`).

    Raises ValueError naming the argument for an unknown task type or room, a room the task
    cannot be set in, or a knob out of range; TypeError for a non-int seed or knob.

    ``usual_place`` (0..1, default 0): probability that the task's object starts in its class's
    usual place (a fixed convention of the generated houses, e.g. keychains in dressers; see
    :func:`usual_places`) where the room has one that may hold it. 0 gives the same games as
    before the knob existed.
    """
    _check_task(task_type)
    _check_int("seed", seed, optional=False)
    if seed >= 2**64:
        raise ValueError(f"seed={seed} is out of range: expected 0 <= seed < 2**64")
    if room is not None:
        _check_room(room)
    _check_int("receptacles", receptacles, optional=True)
    _check_int("distractors", distractors, optional=True)
    if isinstance(usual_place, bool) or not isinstance(usual_place, (int, float)):
        raise TypeError(f"usual_place={usual_place!r}: expected a number in [0, 1]")
    if not 0.0 <= usual_place <= 1.0:
        raise ValueError(f"usual_place={usual_place} is out of range: expected a probability in [0, 1]")
    mod = _native.require("_envpool")
    return _native_call(
        mod.generate_game_json, task_type, seed, room=room, receptacles=receptacles, distractors=distractors,
        usual_place=float(usual_place),
    )


def write_game(path: str | os.PathLike[str], task_type: str, seed: int, **knobs: object) -> Path:
    """Generate a game and write it; returns the file written.

    ``path`` is the file to write, or an existing directory (the file is then
    ``<path>/game.tw-pddl``, the layout the ALFWorld loaders expect). Parent directories are
    created. ``knobs`` are :func:`generate_game_json`'s keyword arguments.
    """
    text = generate_game_json(task_type, seed, **knobs)  # type: ignore[arg-type]
    out = Path(path)
    if out.is_dir():
        out = out / GAME_FILENAME
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text, encoding="ascii")
    tmp.replace(out)
    return out


def write_games(out_dir: str | os.PathLike[str], count: int, seed: int,
                task_types: Sequence[str] = TASK_TYPES, rooms: Sequence[str] | None = None,
                **knobs: object) -> list[str]:
    """A fixed list of ``count`` games in ``out_dir``: game ``i`` is ``NNNNN-<task type>.tw-pddl`` with
    task type ``task_types[i % len(task_types)]`` and seed ``seed + i``; files already there are
    reused (the list is the same on every call with the same arguments).

    ``rooms`` (optional) restricts the rooms: game ``i`` is set in the rooms of ``rooms`` its task
    type allows, in rotation; a task type that none of them allows is a ValueError."""
    if not task_types:
        raise ValueError("task_types: expected at least one task type")
    for tt in task_types:
        _check_task(tt)
    allowed: dict[str, list[str]] = {}
    if rooms is not None:
        for r in rooms:
            _check_room(r)
        for tt in task_types:
            allowed[tt] = [r for r in rooms if r in task_rooms(tt)]
            if not allowed[tt]:
                raise ValueError(f"rooms={list(rooms)}: task type {tt} can only be set in "
                                 f"{', '.join(task_rooms(tt))}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        tt = task_types[i % len(task_types)]
        p = out / f"{i:05d}-{tt}.tw-pddl"
        if not p.exists():
            kw = dict(knobs)
            if rooms is not None:
                kw["room"] = allowed[tt][(i // len(task_types)) % len(allowed[tt])]
            write_game(p, tt, seed + i, **kw)
        paths.append(str(p))
    return paths
