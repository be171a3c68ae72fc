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

Lists of games: :class:`ProceduralGames` is the fixed list ``count`` games long (game ``i``: task
type ``task_types[i % len]``, seed ``seed + i``) as a sequence of :class:`ProceduralGame`, each
named as its file would be and generated only when it is played: an env pool takes it as it
takes a game file (:class:`pcsd.envs.pool.EnvPool`), so a list of any length costs neither disk
nor memory (the trainer's training games). :func:`write_games` writes the same list as files.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

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
    "ProceduralGame",
    "ProceduralGames",
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
        mod.generate_game_json,
        task_type,
        seed,
        room=room,
        receptacles=receptacles,
        distractors=distractors,
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


@dataclass(frozen=True)
class ProceduralGame:
    """One generated game, named by its generator arguments; its text is made when it is needed.

    ``name`` is the file name :func:`write_games` gives it (``NNNNN-<task type>.tw-pddl``), and
    ``str(game)`` is that name, so evaluation names and seeds (:func:`pcsd.eval.games.game_name`)
    are those of the file. An :class:`pcsd.envs.pool.EnvPool` plays it without a file."""

    name: str
    task_type: str
    seed: int
    knobs: tuple[tuple[str, Any], ...] = ()  # generate_game_json's keyword arguments

    def text(self) -> str:
        """The ``game.tw-pddl`` text (the bytes :meth:`write` writes)."""
        return generate_game_json(self.task_type, self.seed, **dict(self.knobs))

    def write(self, path: str | os.PathLike[str]) -> Path:
        """Writes the game to ``path`` (see :func:`write_game`)."""
        return write_game(path, self.task_type, self.seed, **dict(self.knobs))

    def __str__(self) -> str:
        return self.name


class ProceduralGames(Sequence[ProceduralGame]):
    """The fixed list of ``count`` games: game ``i`` has task type ``task_types[i % len(task_types)]``
    and seed ``seed + i``; with ``rooms``, it is set in the rooms of ``rooms`` its task type allows, in
    rotation (a task type that none of them allows is a ValueError). ``knobs`` are
    :func:`generate_game_json`'s (``receptacles``, ``distractors``, ``usual_place``), checked here.
    Items are made on access (O(1) memory for any ``count``); equal arguments give equal games."""

    def __init__(
        self,
        count: int,
        seed: int,
        task_types: Sequence[str] = TASK_TYPES,
        rooms: Sequence[str] | None = None,
        **knobs: Any,
    ) -> None:
        _check_int("count", count, optional=False)
        _check_int("seed", seed, optional=False)
        if not task_types or isinstance(task_types, str):
            raise ValueError("task_types: expected at least one task type")
        self.task_types = tuple(_check_task(tt) for tt in task_types)
        self.rooms: dict[str, tuple[str, ...]] | None = None
        if rooms is not None:
            given = [_check_room(r) for r in rooms]
            self.rooms = {}
            for tt in self.task_types:
                self.rooms[tt] = tuple(r for r in given if r in task_rooms(tt))
                if not self.rooms[tt]:
                    raise ValueError(f"rooms={given}: task type {tt} can only be set in {', '.join(task_rooms(tt))}")
        unknown = set(knobs) - {"receptacles", "distractors", "usual_place"}
        if unknown:
            raise TypeError(f"unknown knob(s) {sorted(unknown)}: expected receptacles, distractors, usual_place")
        if seed + max(count - 1, 0) >= 2**64:
            raise ValueError(f"seed={seed}: the last game's seed {seed + count - 1} is not below 2**64")
        self._count, self.seed, self.knobs = count, seed, dict(knobs)
        if count:  # a bad knob is an error here, not when a game is first played
            self[0].text()

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, i: int) -> ProceduralGame: ...
    @overload
    def __getitem__(self, i: slice) -> list[ProceduralGame]: ...

    def __getitem__(self, i: int | slice) -> ProceduralGame | list[ProceduralGame]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(self._count))]
        k = int(i) + self._count if int(i) < 0 else int(i)
        if not 0 <= k < self._count:
            raise IndexError(f"game index {i} out of range for {self._count} games")
        tt = self.task_types[k % len(self.task_types)]
        kw = dict(self.knobs)
        if self.rooms is not None:
            kw["room"] = self.rooms[tt][(k // len(self.task_types)) % len(self.rooms[tt])]
        return ProceduralGame(f"{k:05d}-{tt}.tw-pddl", tt, self.seed + k, tuple(sorted(kw.items())))

    def __repr__(self) -> str:
        return f"ProceduralGames(count={self._count}, seed={self.seed}, task_types={self.task_types})"


def write_games(
    out_dir: str | os.PathLike[str],
    count: int,
    seed: int,
    task_types: Sequence[str] = TASK_TYPES,
    rooms: Sequence[str] | None = None,
    **knobs: object,
) -> list[str]:
    """The files of :class:`ProceduralGames` ``(count, seed, task_types, rooms, **knobs)`` in
    ``out_dir``: game ``i`` is ``NNNNN-<task type>.tw-pddl``; files already there are reused (the
    list is the same on every call with the same arguments)."""
    games = ProceduralGames(count, seed, task_types, rooms, **knobs)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for g in games:
        p = out / g.name
        if not p.exists():
            g.write(p)
        paths.append(str(p))
    return paths
