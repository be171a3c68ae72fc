"""pcsd.envs.textarena against the real ``textarena`` package (pinned in the ``textarena`` extra):
real games played to the end by scripted policies, the experts against plain references, seeds,
invalid moves, and one test per class of bad input. Only games that run offline are used."""

from __future__ import annotations

import collections
import importlib.util
import os
import random
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pcsd.envs import textarena as ta_env
from pcsd.envs.textarena import TextArenaEnv, check

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

if importlib.util.find_spec("textarena") is None:
    if IN_CI:
        pytest.fail(
            "the 'textarena' package is not installed (required under CI; run.sh installs .[textarena])", pytrace=False
        )
    pytest.skip("the 'textarena' package is not installed (pip install '.[textarena]')", allow_module_level=True)


def one_line(e: pytest.ExceptionInfo[BaseException]) -> str:
    msg = str(e.value)
    assert "\n" not in msg and msg.strip() == msg and msg
    return msg


# --- GuessTheNumber ---------------------------------------------------------------------------------


def play_bisect(env: TextArenaEnv, seed: int, lo: int = 1, hi: int = 20) -> tuple[list[tuple], int]:
    """Plays a game by binary search on the hints in the observations; returns the steps and the
    number it ended on."""
    obs, info = env.reset(seed=seed)
    steps = []
    while True:
        guess = (lo + hi) // 2
        obs, reward, term, trunc, info = env.step(f"[{guess}]")
        steps.append((obs, reward, term, trunc, info))
        if term:
            return steps, guess
        if "higher" in obs:
            lo = guess + 1
        else:
            assert "lower" in obs, obs
            hi = guess - 1


def test_guess_the_number_played_to_the_end_by_binary_search() -> None:
    env = TextArenaEnv("GuessTheNumber-v0")
    targets = collections.Counter()
    for seed in range(120):
        steps, number = play_bisect(env, seed)
        *middle, last = steps
        assert all(r == 0.0 and not t and not tr and not i["invalid_move"] for _, r, t, tr, i in middle)
        obs, reward, term, trunc, info = last
        assert (reward, term, trunc, info["won"], info["invalid_move"]) == (1.0, True, False, True, False)
        assert "Congratulations" in obs and info["reason"] in obs
        assert len(steps) <= 5  # ceil(log2(21))
        targets[number] += 1
    assert set(targets) == set(range(1, 21))  # the seeds reach every number of the range


def test_guess_the_number_task_and_observations() -> None:
    env = TextArenaEnv("GuessTheNumber-v0")
    obs, info = env.reset(seed=1)
    assert info["task"].startswith("You are Player 0. You are playing Guess The Number.")
    assert "between 1 and 20 within 10 turns" in info["task"]
    assert obs == info["task"]  # the first turn's messages: the prompt only
    assert info["task_type"] == "GuessTheNumber-v0"
    obs, *_ = env.step("[10]")
    assert obs in ("The target number is higher.", "The target number is lower.")  # no echo of the action


def test_guess_the_number_expert_is_the_binary_search() -> None:
    """The expert's guesses are those of the plain binary search on the hints, on every seed."""
    env = TextArenaEnv("GuessTheNumber-v0-hardcore")  # 1..50
    for seed in range(60):
        env.reset(seed=seed)
        lo, hi, n = 1, 50, 0
        while True:
            guess = (lo + hi) // 2
            assert env.expert_action() == f"[{guess}]"
            obs, reward, term, _, info = env.step(env.expert_action())
            n += 1
            if term:
                assert info["won"] and reward == 1.0 and n <= 6
                break
            lo, hi = (guess + 1, hi) if "higher" in obs else (lo, guess - 1)
    with pytest.raises(RuntimeError, match="after the game ended"):
        env.expert_action()


def test_invalid_moves_as_the_game_reports_them() -> None:
    env = TextArenaEnv("GuessTheNumber-v0")
    env.reset(seed=0)
    obs, reward, term, _, info = env.step("hello")  # sent as "[hello]": not a number
    assert (reward, term, info["invalid_move"]) == (0.0, False, True)
    assert obs.startswith("You attempted an invalid move. Reason: Invalid move format.")
    obs, reward, term, _, info = env.step("[7]")  # a valid move resets the game's error count
    assert not term and not info["invalid_move"]
    env.step("[7]")  # guessed already: invalid
    obs, reward, term, _, info = env.step("[0]")  # out of range, the second invalid move in a row ends it
    assert term and info["invalid_move"] and not info["won"]
    assert info["reason"].startswith("Invalid Move: Invalid move.") and obs.endswith(info["reason"])
    assert 0.0 <= reward < 1.0  # the game's partial credit for the last valid guess


def test_turn_limit_is_a_loss_with_the_games_partial_credit() -> None:
    """(TextArena checks the limit before counting the turn: max_turns=2 ends on the third guess.)"""
    env = TextArenaEnv("GuessTheNumber-v0", max_turns=2)  # constructor kwargs over the id's
    for seed in range(10):
        env.reset(seed=seed)
        number = env._game.game_number
        wrong = [g for g in (1, 20, 2, 19) if g != number][:3]
        assert not any(env.step(f"[{g}]")[2] for g in wrong[:2])
        obs, reward, term, trunc, info = env.step(f"[{wrong[2]}]")
        assert term and not trunc and not info["won"] and not info["invalid_move"]
        assert reward == pytest.approx(1 - abs(wrong[2] - number) / 19) and reward < 1.0
        assert info["reason"].startswith("The turn limit has been reached.")


def test_seed_is_deterministic_and_envs_do_not_share_random() -> None:
    """Same seed, same actions -> same episode, whether the envs step one after the other or
    interleaved in one process (2048 draws a tile from Python's `random` on every move); the
    caller's `random` state is left as it was."""
    moves = ["[w]", "[a]", "[s]", "[d]"] * 6

    def episode(env: TextArenaEnv, seed: int) -> list[tuple]:
        out = [env.reset(seed=seed)]
        out += [env.step(m) for m in moves]
        return out

    alone = [episode(TextArenaEnv("2048-v0-super-easy"), s) for s in (5, 6)]
    assert alone[0] != alone[1]
    assert alone[0] == episode(TextArenaEnv("2048-v0-super-easy"), 5)
    # the reference: TextArena alone on the global `random`, the same seed -> the same boards
    import copy

    import textarena as ta

    raw, env = ta.make("2048-v0-super-easy-raw"), TextArenaEnv("2048-v0-super-easy")
    raw.reset(num_players=1, seed=5)
    env.reset(seed=5)
    boards = [[copy.deepcopy(g.state.game_state["board"]) for g in (raw, env._game)]]
    for m in moves:
        raw.step(m)
        env.step(m)
        boards.append([copy.deepcopy(g.state.game_state["board"]) for g in (raw, env._game)])
    assert all(mine == theirs for theirs, mine in boards) and boards[0][0] != boards[-1][0]
    a, b = TextArenaEnv("2048-v0-super-easy"), TextArenaEnv("2048-v0-super-easy")
    random.seed(123)
    ra, rb = [a.reset(seed=5)], [b.reset(seed=6)]
    for m in moves:
        ra.append(a.step(m))
        random.random()  # the caller draws too
        rb.append(b.step(m))
    assert [ra, rb] == alone
    after = random.getstate()
    random.seed(123)
    for _ in moves:
        random.random()
    assert random.getstate() == after  # the envs drew nothing from the caller's `random`
    check("2048-v0-super-easy")  # nor does check's trial reset
    TextArenaEnv("2048-v0-super-easy").reset(seed=1)
    assert random.getstate() == after


# --- TowerOfHanoi -----------------------------------------------------------------------------------


def hanoi(n: int, source: str, target: str, spare: str) -> list[str]:
    if n == 0:
        return []
    return hanoi(n - 1, source, spare, target) + [f"[{source} {target}]"] + hanoi(n - 1, spare, target, source)


@pytest.mark.parametrize("env_id,disks", [("TowerOfHanoi-v0", 3), ("TowerOfHanoi-v0-medium", 4)])
def test_tower_of_hanoi_known_solution(env_id: str, disks: int) -> None:
    env = TextArenaEnv(env_id)
    obs, info = env.reset(seed=0)
    assert "Current Board:" in obs and obs.startswith(info["task"])  # prompt, then the board
    solution = hanoi(disks, "A", "C", "B")
    for i, move in enumerate(solution):
        assert env.expert_action() == move
        obs, reward, term, trunc, info = env.step(move)
        assert term == (i == len(solution) - 1)
    assert (reward, info["won"]) == (1.0, True)
    assert f"C: {list(range(disks, 0, -1))}" in obs and obs.endswith("You solved the Tower of Hanoi puzzle.")


def hanoi_distances(disks: int) -> dict[tuple[str, ...], int]:
    """Reference: breadth-first search back from the solved position over every position
    (position: the tower of each disk, smallest first)."""
    solved = ("C",) * disks
    dist = {solved: 0}
    frontier = [solved]
    while frontier:
        nxt = []
        for pos in frontier:
            for disk in range(disks):
                # a disk moves when no smaller disk is on its tower or on the target tower
                for target in "ABC":
                    if target == pos[disk] or any(pos[d] in (pos[disk], target) for d in range(disk)):
                        continue
                    new = pos[:disk] + (target,) + pos[disk + 1 :]
                    if new not in dist:
                        dist[new] = dist[pos] + 1
                        nxt.append(new)
        frontier = nxt
    return dist


DIST = {n: hanoi_distances(n) for n in (3, 4, 5)}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(disks=st.sampled_from([3, 4, 5]), walk=st.lists(st.integers(0, 5), max_size=40))
def test_tower_of_hanoi_expert_is_optimal_from_any_position(disks: int, walk: list[int]) -> None:
    """From a position reached by random legal moves, the expert solves the game in exactly the
    breadth-first distance of that position."""
    env = TextArenaEnv("TowerOfHanoi-v0", num_disks=disks, max_turns=10_000)
    env.reset(seed=0)
    game = env._game
    pairs = [(s, t) for s in "ABC" for t in "ABC" if s != t]
    for k in walk:
        towers = game.state.game_state["towers"]
        legal = [(s, t) for s, t in pairs if towers[s] and (not towers[t] or towers[t][-1] > towers[s][-1])]
        s, t = legal[k % len(legal)]
        *_, term, _, info = env.step(f"[{s} {t}]")
        assert not info["invalid_move"]
        if term:
            return  # the walk solved it
    towers = game.state.game_state["towers"]
    where = {d: name for name, ds in towers.items() for d in ds}
    expected = DIST[disks][tuple(where[d] for d in range(1, disks + 1))]
    moves = 0
    while True:
        *_, term, _, info = env.step(env.expert_action())
        moves += 1
        assert not info["invalid_move"]
        if term:
            break
    assert info["won"] and moves == expected


def test_expert_only_for_games_that_have_one() -> None:
    assert check("GuessTheNumber-v0").has_expert and check("TowerOfHanoi-v0").has_expert
    assert not check("Minesweeper-v0-small").has_expert
    env = TextArenaEnv("Minesweeper-v0-small")
    assert not hasattr(env, "expert_action")
    assert hasattr(TextArenaEnv("TowerOfHanoi-v0"), "expert_action")


# --- bad input: one line each ------------------------------------------------------------------------


@pytest.mark.parametrize("env_id", ["TicTacToe-v0", "QuantumTicTacToe-v0"])
def test_multi_player_id_refused(env_id: str) -> None:
    """TicTacToe cannot start with one player; QuantumTicTacToe starts but as a two-player game."""
    for make in (check, TextArenaEnv):
        with pytest.raises(ValueError) as e:
            make(env_id)
        msg = one_line(e)
        assert msg.startswith(f"env_id {env_id!r}:") and "single-player" in msg


def test_unknown_game_id() -> None:
    with pytest.raises(ValueError) as e:
        TextArenaEnv("GuessTheNumbr-v0")
    assert "has no such game; did you mean GuessTheNumber-v0" in one_line(e)
    with pytest.raises(TypeError) as e:
        check("")
    one_line(e)


def test_bad_game_kwargs() -> None:
    with pytest.raises(ValueError) as e:
        TextArenaEnv("GuessTheNumber-v0", max_numbr=50)
    assert "cannot be made here: TypeError:" in one_line(e) and "'max_numbr'" in str(e.value)


def test_game_that_cannot_start_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """GuessWho needs an OpenRouter key: the game's own reason, on one line."""
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    with pytest.raises(ValueError) as e:
        check("GuessWho-v0")
    assert "cannot be made here: ValueError: OpenRouter API key not found" in one_line(e)


def test_nltk_lookup_error_is_one_line() -> None:
    """NLTK's missing-data error is a framed paragraph; it becomes the resource's name and the fix
    (the word games are not played here: TextArena would try to download the data)."""
    framed = (
        "\n" + "*" * 70 + "\n  Resource \x1b[93mwords\x1b[0m not found.\n  Please use the NLTK Downloader "
        "to obtain the resource:\n\n  >>> import nltk\n  >>> nltk.download('words')\n" + "*" * 70 + "\n"
    )
    msg = ta_env._one_line(framed)
    assert msg.startswith("needs the NLTK data 'words'") and "python -m nltk.downloader words" in msg
    assert "\n" not in msg


def test_missing_package_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "textarena", None)  # `import textarena` now fails as if absent
    for make in (check, TextArenaEnv):
        with pytest.raises(ImportError) as e:
            make("GuessTheNumber-v0")
        msg = one_line(e)
        assert "'textarena' package" in msg and "pcsd[textarena]" in msg


def test_protocol_misuse() -> None:
    env = TextArenaEnv("GuessTheNumber-v0")
    with pytest.raises(RuntimeError, match="before reset"):
        env.step("[3]")
    env.reset(seed=0)
    with pytest.raises(TypeError, match="action must be a str"):
        env.step(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="options: TextArena games take no reset options"):
        env.reset(seed=0, options={"difficulty": 2})
    with pytest.raises(TypeError, match="seed must be an int"):
        env.reset(seed="1")  # type: ignore[arg-type]
    env.close()
    with pytest.raises(RuntimeError):
        env.step("[3]")
