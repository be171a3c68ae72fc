"""The evaluation protocols (pcsd.eval.protocol): the paper's draw is TextWorld's own, per
validation; a stratified subset keeps every category's share; Overall gets a Wilson interval."""

from __future__ import annotations

from collections import Counter

import pytest

from pcsd.eval import protocol as P
from pcsd.eval.games import EvalError, game_task_type, split_games


def _textworld_draw(games, seed: int, validation_index: int) -> str:
    """What verl-agent's AlfworldWorker gets: a TextWorld batch env of one game over the split,
    ``env.seed(seed)``, then one ``reset`` per validation (TextWorld's own code, no engine started)."""
    from textworld.gym.envs.textworld_batch import TextworldBatchGymEnv

    env = TextworldBatchGymEnv.__new__(TextworldBatchGymEnv)  # the game-order part only
    env.gamefiles = list(games)
    env.seed(seed)
    for _ in range(validation_index):
        next(env._gamefiles_iterator)
    return next(env._gamefiles_iterator)


def test_paper_draw_is_textworlds(alfworld_data):
    pytest.importorskip("textworld")
    games = split_games("valid_seen")
    for v in (0, 1, 139, 140, 141):  # the first pass, and the reshuffled second pass
        got = P.paper_episodes(games, episodes=12, seed=0, validation_index=v)
        want = [_textworld_draw(games, 0 + 1000 + i, v) for i in range(12)]
        assert got == want, v


def test_paper_protocol_draws_128_with_replacement(alfworld_data):
    games = split_games("valid_seen")
    a = P.protocol_games(games, "paper")
    assert len(a) == 128 and len(set(a)) < 128  # drawn with replacement
    assert a == P.protocol_games(games, "paper")  # the same draw every time
    assert a != P.protocol_games(games, "paper", validation_index=1)  # the next validation differs
    assert a != P.protocol_games(games, "paper", seed=1)
    assert P.protocol_games(games, "full") == games


def test_stratified_subset_keeps_every_categorys_share(alfworld_data):
    games = split_games("valid_seen")
    full = Counter(game_task_type(g) for g in games)
    sub = P.stratified_subset(games, 70, seed=3)
    got = Counter(game_task_type(g) for g in sub)
    assert len(sub) == 70 and set(sub) <= set(games) and sub == [g for g in games if g in set(sub)]
    for tt, n in full.items():
        assert abs(got[tt] - n * 70 / len(games)) < 1, tt
    # truncating the sorted list (the old eval.episodes) loses whole categories' shares
    trunc = Counter(game_task_type(g) for g in games[:70])
    assert max(abs(trunc[tt] - n / 2) for tt, n in full.items()) > 1
    assert P.stratified_subset(games, 70, seed=3) == sub and P.stratified_subset(games, 70, seed=4) != sub


def test_wilson_interval_known_values():
    lo, hi = P.wilson_interval(5, 10)
    assert (round(lo, 2), round(hi, 2)) == (23.66, 76.34)
    assert P.wilson_interval(0, 10)[0] == 0.0 and round(P.wilson_interval(0, 10)[1], 2) == 27.75
    lo, hi = P.wilson_interval(64, 128)
    assert 40 < lo < 42 and 58 < hi < 60


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: P.paper_episodes(["g"], episodes=0), "episodes=0"),
        (lambda: P.paper_episodes(["g"], validation_index=-1), "validation_index=-1"),
        (lambda: P.paper_episodes([]), "games is empty"),
        (lambda: P.stratified_subset(["g"], 0), "count=0"),
        (lambda: P.protocol_games(["g"], "best"), "protocol='best' is unknown"),
    ],
)
def test_bad_arguments(call, message):
    with pytest.raises(EvalError, match=message):
        call()


def test_table_reports_the_interval_and_the_protocol():
    from pcsd.eval.run import EvalResult, GameResult, render_table

    games = [GameResult("g", "pick_and_place_simple", "Pick", i < 3, 1, 0) for i in range(4)]
    md = render_table(
        [
            EvalResult(
                "PCSD",
                "valid_seen",
                games,
                dict(temperature=0.4, seed=1, protocol="paper", validation_index=2, draw_seed=0),
            )
        ]
    )
    assert "4 episodes" in md and "drawn with replacement" in md and "validation 2" in md
    lo, hi = P.wilson_interval(3, 4)
    assert f"Overall, 95 % Wilson interval: PCSD [{lo:.1f}, {hi:.1f}]" in md
