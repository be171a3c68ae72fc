"""Procedurally generated ALFWorld games (pcsd.envs.procedural).

The generator's own rules are tested in Rust (``cargo test alfworld_gen``). Here: the Python API
(determinism, argument errors, file writing) and the decisive check that generated games load and
are won by their walkthrough in the REAL ALFWorld engine (textworld's PDDL env wrapped the way
alfworld 0.4.2 does: AlfredDemangler(shuffle=False) + AlfredInfos). The engine tests skip when
alfworld/textworld are not installed (and fail under CI, where they must be).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re

import pytest

from pcsd.envs import procedural
from pcsd.envs.procedural import TASK_TYPES, generate_game_json, write_game

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# (seed, knobs) per task type; every task type is played with each entry.
ENGINE_CASES = [
    (0, {}),
    (17, {"distractors": 0}),
    (123456789, {"receptacles": None, "distractors": 40}),
]


@pytest.fixture(scope="module")
def engine():
    for name in ("alfworld", "textworld", "fast_downward"):
        if importlib.util.find_spec(name) is None:
            msg = f"the real ALFWorld engine needs the '{name}' package"
            if IN_CI:
                pytest.fail(msg + " (required under CI)", pytrace=False)
            pytest.skip(msg)
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos

    def start(path):
        infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"])
        return textworld.start(str(path), infos, wrappers=[AlfredDemangler(shuffle=False), AlfredInfos])

    return start


def _receptacle_ids(problem: str) -> list[str]:
    return re.findall(r"^        (\S+) - receptacle$", problem, re.M)


def test_task_types_match_native():
    from pcsd import _native

    assert tuple(_native.require("_envpool").gen_task_types()) == TASK_TYPES
    assert procedural.task_rooms("pick_heat_then_place_in_recep") == ("kitchen",)
    lo, hi = procedural.receptacle_range("bedroom")
    assert 0 < lo < hi


@pytest.mark.parametrize("task_type", TASK_TYPES)
def test_deterministic_and_official_keys(task_type):
    a = generate_game_json(task_type, 7, distractors=5)
    assert a == generate_game_json(task_type, 7, distractors=5)
    assert a != generate_game_json(task_type, 8, distractors=5)
    game = json.loads(a)
    assert list(game)[:5] == ["pddl_domain", "grammar", "pddl_problem", "solvable", "walkthrough"]
    assert game["solvable"] is True
    assert game["walkthrough"] and all(isinstance(c, str) for c in game["walkthrough"])
    assert game["pcsd_gen"]["task_type"] == task_type
    assert game["pcsd_gen"]["num_distractors"] == 5
    assert f'"rhs": "Your task is to: {game["pcsd_gen"]["task"]}."' in game["grammar"]


def test_knobs_are_honoured():
    lo, _ = procedural.receptacle_range("kitchen")
    game = json.loads(generate_game_json("pick_cool_then_place_in_recep", 3, room="kitchen", receptacles=lo + 4))
    assert len(_receptacle_ids(game["pddl_problem"])) == lo + 4
    assert game["pcsd_gen"]["room"] == "kitchen"


@pytest.mark.parametrize(
    ("kwargs", "exc", "needle"),
    [
        ({"task_type": "pick_and_place"}, ValueError, "task_type='pick_and_place'"),
        ({"room": "attic"}, ValueError, "room='attic'"),
        ({"room": "bedroom", "task_type": "pick_heat_then_place_in_recep"}, ValueError, "room bedroom"),
        ({"receptacles": 1000}, ValueError, "receptacles=1000 is out of range"),
        ({"receptacles": -1}, ValueError, "receptacles=-1"),
        ({"distractors": 61}, ValueError, "distractors=61 is out of range: expected 0..=60"),
        ({"seed": -3}, ValueError, "seed=-3"),
        ({"seed": 2**64}, ValueError, "seed="),
        ({"seed": 1.5}, TypeError, "seed must be an int"),
        ({"distractors": True}, TypeError, "distractors must be an int or None"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, exc, needle):
    call = {"task_type": "pick_and_place_simple", "seed": 0} | kwargs
    task_type, seed = call.pop("task_type"), call.pop("seed")
    with pytest.raises(exc, match=re.escape(needle)):
        generate_game_json(task_type, seed, **call)


def test_write_game(tmp_path):
    out = write_game(tmp_path / "a" / "game.tw-pddl", "pick_two_obj_and_place", 5, distractors=3)
    assert out.read_text() == generate_game_json("pick_two_obj_and_place", 5, distractors=3)
    (tmp_path / "b").mkdir()
    out2 = write_game(tmp_path / "b", "look_at_obj_in_light", 5)
    assert out2 == tmp_path / "b" / "game.tw-pddl" and out2.is_file()
    with pytest.raises(TypeError):
        write_game(tmp_path / "c.tw-pddl", "look_at_obj_in_light", 5, colour="red")


@pytest.mark.parametrize("task_type", TASK_TYPES)
def test_real_engine_plays_generated_games(engine, tmp_path, task_type):
    for seed, knobs in ENGINE_CASES:
        path = write_game(tmp_path / f"{seed}" / "game.tw-pddl", task_type, seed, **knobs)
        game = json.loads(path.read_text())
        env = engine(path)
        state = env.reset()
        obs = state.feedback
        where = f"{task_type} seed={seed} {knobs}"
        assert obs.startswith("-= Welcome to TextWorld, ALFRED! =-"), where
        assert f"Your task is to: {game['pcsd_gen']['task']}." in obs, where
        # The opening look lists every receptacle of the problem, by the names the walkthrough uses.
        listing = re.search(r"Looking quickly around you, you see (.*)\.\n", obs)
        assert listing, (where, obs)
        seen = [s.removeprefix("and ").removeprefix("a ").removeprefix("an ") for s in listing.group(1).split(", ")]
        assert len(seen) == len(_receptacle_ids(game["pddl_problem"])), where
        for cmd in game["walkthrough"]:
            if cmd.startswith("go to "):
                assert cmd[len("go to ") :] in seen, (where, cmd)
        assert not state["won"], where
        for cmd in game["walkthrough"]:
            assert cmd in state["admissible_commands"], (where, cmd, state["admissible_commands"])
            state, _, done = env.step(cmd)
            assert "Nothing happens" not in state.feedback, (where, cmd)
        assert state["won"] and done, (where, game["walkthrough"])
        env.close()


def test_write_games_rooms_rotate_within_what_each_task_allows(tmp_path):
    import json

    from pcsd.envs.procedural import write_games

    paths = write_games(
        tmp_path,
        8,
        70,
        ("pick_and_place_simple", "pick_heat_then_place_in_recep"),
        rooms=("bedroom", "kitchen"),
        receptacles=12,
        distractors=0,
    )
    rooms = [json.loads(open(p).read())["pcsd_gen"]["room"] for p in paths]
    assert rooms[0::2] == ["bedroom", "kitchen", "bedroom", "kitchen"]  # pick: both rooms in turn
    assert rooms[1::2] == ["kitchen"] * 4  # heat: only the kitchen
    with pytest.raises(ValueError, match="rooms=.*pick_heat_then_place_in_recep can only be set in kitchen"):
        write_games(tmp_path / "x", 2, 0, ("pick_heat_then_place_in_recep",), rooms=("bedroom",))
    with pytest.raises(ValueError, match="room='attic' is unknown"):
        write_games(tmp_path / "y", 2, 0, rooms=("attic",))
    with pytest.raises(ValueError, match="task_types: expected at least one"):
        write_games(tmp_path / "z", 2, 0, ())


# ----------------------------------------------------------------------------- games on demand
# sha256 (first 16 hex digits) of files the file-based write_games wrote before games were generated
# on demand (pcsd at b5ba070): the tiny-cpu preset's training knobs, and the default knobs
BEFORE_TINY = {
    0: ("00000-pick_and_place_simple.tw-pddl", "693172fb3199146a"),
    1: ("00001-look_at_obj_in_light.tw-pddl", "800b476ee3d4fa3e"),
    5: ("00005-look_at_obj_in_light.tw-pddl", "21bdfa412756c7bd"),
    12: ("00012-pick_and_place_simple.tw-pddl", "5b3247dbf4571d1e"),
    69: ("00069-look_at_obj_in_light.tw-pddl", "d21dfdf19f338458"),
}
BEFORE_DEFAULT = {
    0: ("00000-pick_and_place_simple.tw-pddl", "714fa90936849a79"),
    1: ("00001-look_at_obj_in_light.tw-pddl", "25b1b383089ae93e"),
    5: ("00005-pick_two_obj_and_place.tw-pddl", "0d3112d515df33a5"),
    12: ("00012-pick_and_place_simple.tw-pddl", "76529ea359c14fed"),
}
TINY = dict(
    task_types=("pick_and_place_simple", "look_at_obj_in_light"),
    rooms=("livingroom", "bedroom"),
    receptacles=6,
    distractors=0,
)


def _digest(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode("ascii")).hexdigest()[:16]


def test_games_on_demand_are_the_games_the_files_held(tmp_path):
    """Same seeds, same games: a ProceduralGames item's text is byte for byte the file the
    file-based list wrote before (digests recorded then), and write_games writes those bytes."""
    from pcsd.envs.procedural import ProceduralGames, write_games

    for knobs, before, count in ((TINY, BEFORE_TINY, 70), ({}, BEFORE_DEFAULT, 13)):
        games = ProceduralGames(count, 1000, **knobs)
        paths = write_games(tmp_path / str(count), count, 1000, **knobs)
        assert len(games) == len(paths) == count
        for i, (name, digest) in before.items():
            assert games[i].name == str(games[i]) == name
            assert _digest(games[i].text()) == digest, (i, name)
            assert paths[i].endswith(name) and _digest(open(paths[i]).read()) == digest


def test_a_list_of_any_length_costs_no_disk_and_no_memory():
    """10**12 games: made in O(1), any item on access (the last one too), the same on every access."""
    import time

    from pcsd.envs.procedural import ProceduralGames

    t0 = time.perf_counter()
    games = ProceduralGames(10**12, 1000, **TINY)
    assert time.perf_counter() - t0 < 1.0 and len(games) == 10**12
    last = games[-1]
    assert last == games[10**12 - 1] and last.seed == 1000 + 10**12 - 1
    assert last.name == f"{10**12 - 1:05d}-look_at_obj_in_light.tw-pddl"
    assert json.loads(last.text())["pcsd_gen"]["room"] in ("livingroom", "bedroom")
    assert [g.name for g in games[:3]] == [games[i].name for i in range(3)]
    with pytest.raises(IndexError):
        games[10**12]
    with pytest.raises(ValueError, match="distractors=-1"):
        ProceduralGames(4, 0, distractors=-1)  # a bad knob is an error at once, not when a game is played
    with pytest.raises(ValueError, match="seed"):
        ProceduralGames(10, 2**64 - 5)


def test_the_pool_plays_a_generated_game_as_it_plays_its_file(tmp_path):
    """An EnvPool given ProceduralGame items (no files) steps exactly as one given their files."""
    from pcsd.envs.pool import EnvPool
    from pcsd.envs.procedural import ProceduralGames, write_games

    games = ProceduralGames(3, 77, **TINY)
    paths = write_games(tmp_path, 3, 77, **TINY)
    runs = []
    for arg in (list(games), paths):
        with EnvPool("alfworld", 6, group_size=2, games=arg, max_steps=5) as pool:
            out = [pool.reset()]
            for _ in range(4):
                out.append(pool.step([adm[-1] for adm in out[-1].admissible]))
            runs.append([(b.obs, b.admissible, b.reward.tolist(), b.done.tolist()) for b in out])
            assert [pool.task_of(e) for e in range(6)][::2] == [
                (g.task_type, pool.task_of(2 * k)[1]) for k, g in enumerate(games)
            ]
    assert runs[0] == runs[1]
    with pytest.raises(ValueError, match=r"games\[0\]: expected a game file path or a ProceduralGame"):
        EnvPool("alfworld", 1, games=[3.5])
