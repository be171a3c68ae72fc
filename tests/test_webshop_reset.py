"""The native WebShop's kept reset pages and goal dicts against the plain reset ($WEBSHOP_DATA).

``WebShopEnv.reset(i)`` answers from what its shop keeps per goal (the goal dict, the page and info
of ``reset(i)`` as templates, the goal as the envs play it: ``rust_envpool/src/python/webshop.rs``
``GoalDicts``); ``reset_reference(i)`` makes the same answer the plain way (the env's step result
converted, the goal dict made anew). Random sequences of resets over several envs and shops,
goals that share a kept set, and callers that mutate what they got: every answer equals the
reference's, and the env's own page (no-op step, ``observe``) is the reset page.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest

from pcsd.envs.webshop import WebShop

CONFIGS: dict[str, dict[str, Any]] = {
    "upstream_synth": dict(goals="synthetic", variant="upstream", show_attrs=False),
    "upstream_human": dict(goals="human", variant="upstream", show_attrs=False),
    "upstream_attrs": dict(goals="synthetic", variant="upstream", show_attrs=True),
    "verl": dict(goals="synthetic", variant="verl", show_attrs=False),
}
#: sets of the shop's kept goals (``GOAL_DICTS / 2``, two slots each): goals this far apart share
#: one, and a third goal of a set pushes out the one used least recently
SETS = 2048


@lru_cache(maxsize=None)
def _shop(root: str, config: str) -> WebShop:
    return WebShop.load(Path(root) / "data", seed=0, **CONFIGS[config])


def _same(got: tuple[str, dict[str, Any]], want: tuple[str, dict[str, Any]]) -> None:
    assert got[0] == want[0]
    assert got[1] == want[1]
    assert list(got[1]) == list(want[1])
    for key in ("price_upper", "weight"):  # 1000000 == 1000000.0: the types too
        assert type(got[1]["goal"][key]) is type(want[1]["goal"][key])


def _mutate(info: dict[str, Any]) -> None:
    """What a careless caller does to its info: every container and value changed."""
    goal = info.get("goal")
    if goal is not None:
        goal["attributes"].append("mutated")
        opts = goal["goal_options"]
        if isinstance(opts, dict):
            opts["mutated"] = "yes"
        else:
            opts.append("mutated")
        goal["asin"] = "MUTATED"
        goal["new key"] = 1
    info["available_actions"]["clickables"].append("mutated")
    info["available_actions"]["has_search_bar"] = False
    info["url"] = "mutated"
    info["goal_index"] = -1
    info["extra"] = True


def test_reset_equals_the_plain_reset_on_random_goal_sequences(webshop_data: Path) -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    shops = {c: _shop(str(webshop_data), c) for c in CONFIGS}
    refs = {c: s.env() for c, s in shops.items()}
    envs = {c: [s.env() for _ in range(3)] for c, s in shops.items()}

    @st.composite
    def resets(draw: Any) -> list[tuple[str, int, int, bool]]:
        out = []
        for _ in range(draw(st.integers(1, 12))):
            config = draw(st.sampled_from(sorted(CONFIGS)))
            n = shops[config].num_goals
            # a few goals again and again, and goals that share a set
            base = draw(st.integers(0, min(n, 6) - 1))
            goal = base + SETS * draw(st.integers(0, 3))
            goal = goal if goal < n else base
            goal = draw(st.one_of(st.just(goal), st.integers(0, n - 1)))
            out.append((config, draw(st.integers(0, 2)), goal, draw(st.booleans())))
        return out

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(seq=resets())
    def check(seq: list[tuple[str, int, int, bool]]) -> None:
        for config, e, goal, mutate in seq:
            env = envs[config][e]
            got = env.reset(goal)
            want = refs[config]._e.reset_reference(goal)
            _same(got, want)
            assert env.goal == want[1]["goal"] and env.goal_index == goal and env.url == want[1]["url"]
            # the env's own page is the reset page: a no-op step and observe show it
            obs, reward, done, info = env.step("no op")
            assert (obs, reward, done) == (want[0], 0, False)
            assert info["available_actions"] == want[1]["available_actions"] and info["url"] == want[1]["url"]
            if mutate:
                _mutate(got[1])
                _mutate(info)
        # a new env after all that: the same pages
        for config, _, goal, _ in seq:
            _same(shops[config].env().reset(goal), refs[config]._e.reset_reference(goal))

    check()


def test_a_caller_mutating_its_reset_info_changes_no_other_caller(webshop_data: Path) -> None:
    shop = _shop(str(webshop_data), "upstream_synth")
    a, b = shop.env(), shop.env()
    want = shop.env()._e.reset_reference(5)
    first = a.reset(5)
    _mutate(first[1])
    _same(b.reset(5), want)
    _same(a.reset(5), want)
    assert shop.goal(5) == want[1]["goal"]


@pytest.mark.parametrize("config", ["upstream_synth", "upstream_human"])
def test_a_goal_taking_a_kept_slot_over_gives_its_own_page(webshop_data: Path, config: str) -> None:
    shop = _shop(str(webshop_data), config)
    ref = shop.env()
    goals = [g for g in (0, SETS, 2 * SETS, 1, SETS + 1, 0, 3 * SETS, SETS, 2 * SETS + 1) if g < shop.num_goals]
    for g in goals:
        _same(shop.env().reset(g), ref._e.reset_reference(g))
