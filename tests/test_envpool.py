"""pcsd.envs.pool.EnvPool on the native ``dummy`` env: sync/async calls, the auto-reset rule, the
step limit, panic isolation, every class of bad input, GIL release, Ctrl-C, threads, and fork."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from pcsd import _native

if _native.envpool() is None or not hasattr(_native.envpool(), "EnvPool"):
    pytest.skip("pcsd._envpool with EnvPool is not built (tools/build_inplace.sh)", allow_module_level=True)

from pcsd.envs.pool import EnvPool, StepBatch  # noqa: E402

DIRS = ["go east", "go north", "go south", "go west"]


def requested(obs: str) -> str:
    """The command a dummy observation asks for."""
    return obs.split("say '")[1].split("'")[0]


def pool(num_envs: int = 4, **kw) -> EnvPool:
    kw.setdefault("num_threads", 2)
    kw.setdefault("episode_len", 3)
    return EnvPool("dummy", num_envs, **kw)


# ---------------------------------------------------------------- sync


def test_reset_and_step_sync_with_groups():
    p = pool(6, group_size=3, seed=10)
    assert (p.num_envs, p.num_games, p.group_size, len(p)) == (6, 2, 3, 6)
    b = p.reset()
    assert isinstance(b, StepBatch) and len(b) == 6
    assert b.env_id.tolist() == list(range(6))
    # Envs of a group share the game and its seed; groups differ.
    assert b.obs[0] == b.obs[1] == b.obs[2] and b.obs[3] == b.obs[4] == b.obs[5]
    assert "Dummy game 10," in b.obs[0] and "Dummy game 11," in b.obs[3]
    assert b.admissible[0] == DIRS and b.task_type == ["dummy"] * 6
    assert b.step_count.dtype == np.int64 and b.done.dtype == bool
    # Play group 0 right, group 1 wrong, ids given out of order.
    order = [5, 0, 3, 1, 4, 2]
    acts = [requested(b.obs[i]) if i < 3 else "look" for i in order]
    s = p.step(acts, order)
    assert s.env_id.tolist() == order
    assert np.allclose(s.reward, [0.0 if i >= 3 else 1 / 3 for i in order])
    assert s.step_count.tolist() == [1] * 6 and all(e == "" for e in s.error) and s.ok.all()


def test_sync_equals_async_and_thread_counts_agree():
    """The threaded fast paths against each other: 1 vs 2 threads, step vs send+recv."""
    a, b, c = pool(8, group_size=2, num_threads=1), pool(8, group_size=2), pool(8, group_size=2)
    ra, rb = a.reset(), b.reset()
    c.send_reset(range(8))
    rc = c.recv()
    idx = np.argsort(rc.env_id)
    assert ra.obs == rb.obs == [rc.obs[i] for i in idx]
    for t in range(3):
        acts = [DIRS[(i + t) % 4] for i in range(8)]
        sa, sb = a.step(acts), b.step(acts)
        c.send(acts, list(range(8)))
        sc = c.recv(8)
        idx = np.argsort(sc.env_id)
        for f in ("reward", "score", "done", "won", "step_count"):
            assert np.array_equal(getattr(sa, f), getattr(sb, f))
            assert np.array_equal(getattr(sa, f), getattr(sc, f)[idx])
        assert sa.obs == sb.obs == [sc.obs[i] for i in idx]


def test_winning_an_episode():
    p = pool(2, episode_len=2)
    b = p.reset()
    for t in range(2):
        b = p.step([requested(o) for o in b.obs] if t < 2 else ["look"] * 2)
        if t == 0:
            assert not b.done.any()
    assert b.done.all() and b.won.all() and np.allclose(b.score, 1.0) and not b.truncated.any()


# ---------------------------------------------------------------- async


def test_recv_returns_first_finishers_in_completion_order():
    p = pool(3, num_threads=3)
    p.reset()
    p.send(["sleep 400", "sleep 10", "sleep 200"], [0, 1, 2])
    assert p.outstanding == 3 and p.in_flight == 3
    assert p.recv(1).env_id.tolist() == [1]
    p.send(["sleep 10"], [1])  # env 1 is free again while 0 and 2 run
    assert p.recv(2).env_id.tolist() == [1, 2]
    last = p.recv()
    assert last.env_id.tolist() == [0] and p.outstanding == 0


# ---------------------------------------------------------------- rules


def test_auto_reset_rule_step_by_step():
    p = pool(1, episode_len=2, auto_reset=True, num_threads=1)
    assert p.auto_reset
    b = p.step(["ignored"])  # a fresh env: the first step resets it
    assert b.step_count[0] == 0 and not b.done[0] and "step 1 of 2" in b.obs[0]
    b = p.step([requested(b.obs[0])])
    assert b.step_count[0] == 1 and b.reward[0] == pytest.approx(0.5)
    b = p.step([requested(b.obs[0])])
    assert b.done[0] and b.won[0] and b.step_count[0] == 2 and "game is over" in b.obs[0]
    b = p.step(["ignored"])  # the step after done: reset observation, action ignored
    assert not b.done[0] and b.step_count[0] == 0 and b.score[0] == 0 and "step 1 of 2" in b.obs[0]
    assert b.error == [""]


def test_manual_reset_finished_envs_leave_the_batch():
    p = pool(2, episode_len=1)
    p.reset()
    b = p.step(["look", "look"])
    assert b.done.all() and b.ok.all()
    b = p.step(["look"], [0])
    assert b.done[0] and "is done" in b.error[0] and "reset" in b.error[0]
    p.reset([0])
    assert p.step(["look"], [0]).ok.all()


def test_step_limit_truncates():
    p = pool(2, episode_len=10, max_steps=2)
    b = p.reset()
    b = p.step([requested(o) for o in b.obs])
    assert not b.done.any()
    b = p.step([requested(o) for o in b.obs])
    assert b.done.all() and b.truncated.all() and not b.won.any() and b.ok.all()
    assert np.allclose(b.score, 0.2) and b.step_count.tolist() == [2, 2]


def test_panicking_env_is_isolated_and_broken_until_reset():
    p = pool(4, group_size=2, episode_len=5, panic_at_step=2)
    p.reset()
    assert p.step(["look"] * 4).ok.all()
    b = p.step(["look"] * 4)
    assert b.done.all() and all("panicked in step 2" in e for e in b.error)
    b = p.step(["look"] * 4)
    assert all("is broken" in e for e in b.error)
    assert p.reset([1]).ok.all() and p.step(["look"], [1]).ok.all()
    # The pool lives on for everything else.
    assert p.task_of(3) == ("dummy", "say the requested direction at each of 5 steps")


# ---------------------------------------------------------------- bad input: construction


@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        (("nope", 4), {}, "kind: unknown env kind 'nope'"),
        (("dummy", 0), {}, "num_envs"),
        (("dummy", 5), {"group_size": 2}, "num_envs: must be a multiple of group_size"),
        (("dummy", 4), {"group_size": 0}, "group_size"),
        (("dummy", 4), {"num_threads": -1}, "num_threads"),
        (("dummy", 4), {"max_steps": 0}, "max_steps"),
        (("dummy", 4), {"seed": -3}, "seed"),
        (("dummy", 4), {"auto_reset": "yes"}, "auto_reset"),
        (("dummy", 4), {"games": ["x"]}, "games: env kind 'dummy' plays no game files"),
        (("dummy", 4), {"epsiode_len": 3}, "epsiode_len: not an option of env kind 'dummy'"),
        (("dummy", 4), {"episode_len": 0}, "episode_len: expected an int >= 1"),
        (("dummy", 4), {"busy_iters": 1.5}, "busy_iters: expected an int >= 0"),
        (("alfworld", 2), {}, "games: env kind 'alfworld' needs a list"),
        (("alfworld", 2), {"games": ["a"]}, r"games: expected one game per group \(2 envs"),
        (("alfworld", 1), {"games": ["/nonexistent/game.tw-pddl"]}, r"games\[0\]: no such game file"),
    ],
)
def test_bad_constructor_arguments(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        EnvPool(*args, **kwargs)


def test_alfworld_pool_plays_the_same_game_as_the_engine(tmp_path):
    from pcsd.envs.alfworld import AlfworldGame
    from pcsd.envs.procedural import write_game

    games = [
        write_game(tmp_path / f"g{i}.tw-pddl", tt, 7 + i)
        for i, tt in enumerate(["pick_and_place_simple", "pick_heat_then_place_in_recep"])
    ]
    pool = EnvPool("alfworld", 4, group_size=2, games=games, max_steps=50)
    first = pool.reset()
    refs = [AlfworldGame.from_file(games[i // 2]) for i in range(4)]
    ref_first = [g.reset() for g in refs]
    for i in range(4):
        assert first.obs[i] == ref_first[i][0]
        assert first.admissible[i] == ref_first[i][1]["admissible_commands"]
        assert pool.task_of(i)[0] == refs[i].task_type
    # play each env's expert plan through the pool and through the engine directly
    plans = [g.expert_plan() for g in refs]
    for t in range(max(len(p) for p in plans)):
        ids = [i for i in range(4) if t < len(plans[i])]
        res = pool.step([plans[i][t] for i in ids], env_ids=ids)
        for k, i in enumerate(ids):
            obs, score, done, info = refs[i].step(plans[i][t])
            assert (res.obs[k], res.score[k], res.done[k], res.won[k]) == (obs, score, done, info["won"])
            assert res.admissible[k] == info["admissible_commands"]
    assert all(g.step("look")[3]["won"] for g in refs)


def test_str_cache_returns_what_building_every_string_returns(tmp_path):
    """The native layer shares the str objects of admissible commands and task types between calls
    (its fast path); str_cache=False builds every string anew (the plain path). Same columns,
    sync and async, over whole episodes with auto-reset."""
    import random

    from pcsd.envs.procedural import write_game

    games = [
        str(write_game(tmp_path / f"g{i}.tw-pddl", tt, 3 + i))
        for i, tt in enumerate(["pick_and_place_simple", "pick_clean_then_place_in_recep", "look_at_obj_in_light"])
    ]
    native = _native.require("_envpool")
    kw = dict(group_size=2, games=games, max_steps=6, num_threads=2, auto_reset=True)
    fast, plain = (native.EnvPool("alfworld", 6, str_cache=c, **kw) for c in (True, False))

    def same(a: StepBatch, b: StepBatch) -> None:
        for f in ("obs", "admissible", "task_type", "error"):
            assert getattr(a, f) == getattr(b, f)
        for f in ("env_id", "reward", "score", "done", "won", "truncated", "step_count"):
            x, y = getattr(a, f), getattr(b, f)
            assert x.dtype == y.dtype and x.flags.writeable and np.array_equal(x, y)
        assert type(a.admissible) is list and all(type(x) is list for x in a.admissible)
        assert all(type(x) is str for adm in a.admissible for x in adm)

    rng = random.Random(0)
    ids = list(range(6))
    a, b = (StepBatch._from_columns(p.reset(ids)) for p in (fast, plain))
    same(a, b)
    assert a.env_id.dtype == np.int64 and a.done.dtype == bool and a.step_count.dtype == np.int64
    # envs 0 and 1 play the same game: the fast path hands out the same objects, the plain one not
    assert all(x is y for x, y in zip(a.admissible[0], a.admissible[1]))
    assert not any(x is y for x, y in zip(b.admissible[0], b.admissible[1]))
    for t in range(20):
        acts = [rng.choice(adm) if adm else "look" for adm in a.admissible]
        if t % 2:
            a, b = (StepBatch._from_columns(p.step(acts, ids)) for p in (fast, plain))
        else:
            for p in (fast, plain):
                p.send(acts, ids)
            a, b = (StepBatch._from_columns(p.recv(6)) for p in (fast, plain))
            order = [np.argsort(x.env_id) for x in (a, b)]
            a, b = (
                StepBatch(**{f: _reorder(getattr(x, f), o) for f in StepBatch.__dataclass_fields__})
                for x, o in zip((a, b), order)
            )
        same(a, b)
    fast.close()
    plain.close()


def _reorder(col, order):
    """A StepBatch column in ``order``; an optional column the native pool leaves out stays None."""
    if col is None:
        return None
    return [col[i] for i in order] if isinstance(col, list) else col[order]


def test_alfworld_corrupt_game_is_a_clear_error(tmp_path):
    bad = tmp_path / "game.tw-pddl"
    bad.write_text('{"pddl_domain": 3}')
    with pytest.raises(ValueError, match="game.tw-pddl"):
        EnvPool("alfworld", 1, games=[bad])


def test_native_layer_validates_too():
    native = _native.require("_envpool")
    with pytest.raises(ValueError, match="num_envs"):
        native.EnvPool("dummy", -1)
    with pytest.raises(ValueError, match="unknown option 'bogus'"):
        native.EnvPool("dummy", 2, options={"bogus": 1})
    with pytest.raises(ValueError, match="episode_len"):
        native.EnvPool("dummy", 2, options={"episode_len": "long"})


# ---------------------------------------------------------------- bad input: calls


def test_bad_call_arguments_raise_and_change_nothing():
    p = pool(3)
    p.reset()
    with pytest.raises(ValueError, match="actions: expected a sequence of str .* single str"):
        p.step("go east", [0])
    with pytest.raises(ValueError, match=r"actions\[1\]: expected str, got int"):
        p.step(["go east", 3], [0, 1])
    with pytest.raises(ValueError, match=r"env_ids\[0\]: expected an int, got float"):
        p.step(["go east"], [0.5])
    with pytest.raises(ValueError, match=r"env_ids\[0\]: expected an int, got bool"):
        p.reset([True])
    with pytest.raises(ValueError, match=r"actions: expected one entry per env id \(2 env ids\), got 1"):
        p.step(["go east"], [0, 1])
    with pytest.raises(ValueError, match="actions: without env_ids, expected one action per env"):
        p.step(["go east"])
    with pytest.raises(ValueError, match="env_ids: env id 1 appears more than once"):
        p.send(["a", "b"], [1, 1])
    with pytest.raises(ValueError, match="batch_size: asked for 1 results but nothing is pending"):
        p.recv(1)
    with pytest.raises(ValueError, match="batch_size: asked for 1 results but nothing is pending"):
        p.recv()
    with pytest.raises(ValueError, match="batch_size: expected an int >= 1"):
        p.recv(0)
    assert p.outstanding == 0
    p.send(["sleep 50"], [2])
    with pytest.raises(ValueError, match="env_ids: env 2 already has a request outstanding"):
        p.step(["a", "b"], [0, 2])
    with pytest.raises(ValueError, match="batch_size: asked for 2 results but only 1"):
        p.recv(2)
    assert p.outstanding == 1
    assert p.recv().env_id.tolist() == [2]
    # numpy ids are fine (the 1-d integer array fast path), other arrays are checked
    assert p.step(["look", "look"], np.array([1, 0])).env_id.tolist() == [1, 0]
    assert p.step(["look"], np.array([2], dtype=np.uint8)).env_id.tolist() == [2]
    with pytest.raises(ValueError, match="env_ids: expected a 1-d array"):
        p.step(["look"], np.array([[0]]))
    with pytest.raises(ValueError, match=r"env_ids\[0\]: expected an int, got float"):
        p.step(["look"], np.array([0.0]))
    # ids beyond int64 (the native type) are a ValueError like any bad id, not an OverflowError
    for big in (2**64, 2**63, -(2**63) - 1):
        for call in (
            lambda: p.step(["look"], [big]),
            lambda: p.reset([big]),
            lambda: p.send(["a"], [big]),
            lambda: p.send_reset([big]),
        ):
            with pytest.raises(ValueError, match=r"env_ids: env ids must fit in int64"):
                call()
        with pytest.raises(ValueError, match=r"env_id: env ids must fit in int64"):
            p.task_of(big)
    assert p.outstanding == 0


def test_out_of_range_ids_are_reported_per_env():
    p = pool(2)
    b = p.reset([0, 5, -1, 1])
    assert b.ok.tolist() == [True, False, False, True]
    assert b.env_id.tolist() == [0, 5, -1, 1]
    assert "env id 5 is out of range: the pool has 2 envs" in b.error[1]
    assert b.done[1] and b.obs[1] == "" and b.admissible[1] == []
    with pytest.raises(ValueError, match="env_id: 9 is out of range"):
        p.task_of(9)


def test_closed_pool_raises():
    with pool(2) as p:
        p.reset()
    assert p.closed and "closed" in repr(p)
    with pytest.raises(RuntimeError, match="closed"):
        p.reset()


# ---------------------------------------------------------------- threads, GIL, Ctrl-C, fork


_THREADS_SCRIPT = """
import os
import time
from pcsd.envs.pool import EnvPool

def count():
    n = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                n += f.read().startswith("pcsd-envpool-")
        except OSError:
            pass
    return n

def settled(expected):
    # Worker threads name themselves as they start: give them a moment.
    deadline = time.monotonic() + 5
    while count() != expected and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    return count()

before = count()
p = EnvPool("dummy", 8, num_threads=3)
three = settled(3)
q = EnvPool("dummy", 2, num_threads=0)
print(before, p.num_threads, three, q.num_threads, settled(3 + os.cpu_count()), os.cpu_count())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts threads through /proc")
def test_num_threads_setting_is_respected(tmp_path):
    # A fresh interpreter, so that no other pool's threads are starting or exiting meanwhile.
    import pcsd

    env = {k: v for k, v in os.environ.items() if k != "RAYON_NUM_THREADS"}
    # import the same pcsd as this process (installed or built in place), whatever the cwd
    site = os.path.dirname(os.path.dirname(os.path.abspath(pcsd.__file__)))
    env["PYTHONPATH"] = site + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run(
        [sys.executable, "-c", _THREADS_SCRIPT],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    before, p_threads, after_p, q_threads, after_q, cpus = map(int, out.stdout.split())
    assert (before, p_threads, after_p) == (0, 3, 3)
    assert q_threads == cpus and after_q == 3 + cpus


def test_gil_is_released_while_waiting():
    p = pool(2)
    p.reset()
    ticks = 0
    stop = threading.Event()

    def count() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            time.sleep(0.001)

    t = threading.Thread(target=count)
    t.start()
    try:
        p.step(["sleep 300", "sleep 300"])
    finally:
        stop.set()
        t.join()
    assert ticks > 20, "a Python thread should run while the pool waits"


def test_ctrl_c_during_a_wait_raises_keyboard_interrupt():
    # Python's own SIGINT handler, also when pytest started with SIGINT ignored (a background job
    # of a non-interactive shell), where Python installs none
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _ctrl_c_during_a_wait()
    finally:
        signal.signal(signal.SIGINT, previous)


def _ctrl_c_during_a_wait() -> None:
    p = pool(2)
    p.reset()
    p.send(["sleep 1500", "sleep 1500"], [0, 1])
    timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))
    t0 = time.monotonic()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        p.recv()
    assert time.monotonic() - t0 < 1.0
    # Nothing is lost: the requests are still outstanding and arrive later.
    assert p.outstanding == 2
    assert sorted(p.recv().env_id.tolist()) == [0, 1]


def _fork_child(q, parent_pool) -> None:  # runs in the forked child
    out = {}
    try:
        parent_pool.step(["look"] * 2)
    except RuntimeError as e:
        out["parent_pool_error"] = str(e)
    out["parent_pool_closed"] = parent_pool.closed
    del parent_pool  # the child's copy is dropped without touching the parent's threads
    p = EnvPool("dummy", 2, group_size=2, num_threads=2, episode_len=3, seed=4)
    b = p.reset()
    s = p.step([requested(o) for o in b.obs])
    out["obs"] = b.obs
    out["reward"] = s.reward.tolist()
    q.put(out)


def test_child_after_fork_builds_its_own_pool():
    parent = EnvPool("dummy", 2, group_size=2, num_threads=2, episode_len=3, seed=4)
    b = parent.reset()
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    proc = ctx.Process(target=_fork_child, args=(q, parent))
    proc.start()
    out = q.get(timeout=60)
    proc.join(timeout=60)
    assert proc.exitcode == 0
    assert "created in process" in out["parent_pool_error"] and "create a new EnvPool" in out["parent_pool_error"]
    assert out["parent_pool_closed"] is True and not parent.closed
    assert out["obs"] == b.obs
    assert out["reward"] == pytest.approx([1 / 3, 1 / 3])
    # The parent's pool still works.
    assert parent.step([requested(o) for o in b.obs]).ok.all()


# ---------------------------------------------------------------- the pool vs a plain Python model

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

M64 = (1 << 64) - 1


def _mix(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


class _RefEnv:
    """The dummy game and the pool's per-env rules, written out plainly in Python."""

    def __init__(self, seed: int, length: int, max_steps: int | None, auto_reset: bool) -> None:
        self.seed, self.len, self.max_steps, self.auto = seed, length, max_steps, auto_reset
        self.status, self.t, self.right, self.score = "fresh", 0, 0, 0.0

    def _target(self, t: int) -> str:
        return DIRS[_mix(self.seed ^ _mix(t)) % 4]

    def _obs(self, prefix: str, game_over: bool) -> str:
        if game_over:
            return f"{prefix}The game is over: {self.right} of {self.len} right."
        return f"{prefix}Dummy game {self.seed}, step {self.t + 1} of {self.len}: say '{self._target(self.t)}'."

    def _fail(self) -> tuple:
        return ("", [], 0.0, self.score, True, False, False, "dummy", self.t, True)

    def reset(self) -> tuple:
        self.status, self.t, self.right, self.score = "running", 0, 0, 0.0
        return (self._obs("", False), list(DIRS), 0.0, 0.0, False, False, False, "dummy", 0, False)

    def step(self, action: str) -> tuple:
        if self.status in ("fresh", "done"):
            return self.reset() if self.auto else self._fail()
        ok = action == self._target(self.t)
        self.right += ok
        self.t += 1
        over = self.t >= self.len
        score = self.right / self.len
        reward, self.score = score - self.score, score
        truncated = not over and self.max_steps is not None and self.t >= self.max_steps
        if over or truncated:
            self.status = "done"
        obs = self._obs("Right. " if ok else "Wrong. ", over)
        won = over and self.right == self.len
        return (
            obs,
            [] if over else list(DIRS),
            reward,
            score,
            over or truncated,
            won,
            truncated,
            "dummy",
            self.t,
            False,
        )


_OUT_OF_RANGE = ("", [], 0.0, 0.0, True, False, False, "", 0, True)


def _rows(b: StepBatch) -> list[tuple]:
    return [
        (
            b.obs[k],
            b.admissible[k],
            b.reward[k],
            b.score[k],
            bool(b.done[k]),
            bool(b.won[k]),
            bool(b.truncated[k]),
            b.task_type[k],
            int(b.step_count[k]),
            b.error[k] != "",
        )
        for k in range(len(b))
    ]


_calls = st.lists(
    st.tuples(
        st.sampled_from(["reset", "step", "step", "step"]),
        st.lists(st.integers(-1, 6), max_size=6),
        st.lists(st.sampled_from(DIRS + ["look"]), min_size=6, max_size=6),
    ),
    min_size=1,
    max_size=15,
)


@settings(max_examples=40, deadline=None)
@given(
    calls=_calls,
    group_size=st.sampled_from([1, 2]),
    length=st.integers(1, 4),
    max_steps=st.sampled_from([None, 1, 2, 3]),
    auto_reset=st.booleans(),
    seed=st.integers(0, 2**40),
)
def test_pool_matches_plain_python_model(calls, group_size, length, max_steps, auto_reset, seed):
    n = 6
    p = EnvPool(
        "dummy",
        n,
        group_size=group_size,
        num_threads=2,
        episode_len=length,
        max_steps=max_steps,
        auto_reset=auto_reset,
        seed=seed,
    )
    ref = [_RefEnv(seed + i // group_size, length, max_steps, auto_reset) for i in range(n)]
    for kind, ids, acts in calls:
        if len(set(ids)) != len(ids):
            with pytest.raises(ValueError, match="appears more than once"):
                p.reset(ids) if kind == "reset" else p.step(acts[: len(ids)], ids)
            continue
        if kind == "reset":
            got = p.reset(ids)
            want = [ref[i].reset() if 0 <= i < n else _OUT_OF_RANGE for i in ids]
        else:
            got = p.step(acts[: len(ids)], ids)
            want = [ref[i].step(a) if 0 <= i < n else _OUT_OF_RANGE for i, a in zip(ids, acts)]
        assert got.env_id.tolist() == ids
        for g, w in zip(_rows(got), want):
            assert g[:2] == w[:2] and g[4:] == w[4:]
            assert g[2] == pytest.approx(w[2]) and g[3] == pytest.approx(w[3])
    p.close()


def test_lone_surrogate_action_is_that_envs_error(tmp_path):
    """A str with a lone surrogate has no UTF-8 form: it is that env's error (not sent to the env),
    the other envs step, and the call does not raise UnicodeEncodeError (ALFWorld and dummy)."""
    from pcsd.envs.procedural import write_game

    game = str(write_game(tmp_path / "g.tw-pddl", "pick_and_place_simple", 3))
    for p in (EnvPool("alfworld", 2, games=[game, game], max_steps=50), pool(2)):
        b = p.reset()
        s = p.step([b.admissible[0][0], "go to \ud800"])
        assert s.error[0] == "" and not s.done[0]
        assert "actions[1] is not valid text" in s.error[1] and s.done[1]
        # the env was not touched: it steps normally afterwards
        s2 = p.step([b.admissible[0][0], b.admissible[1][0]])
        assert s2.ok.all() and s2.step_count.tolist() == [2, 1]
        p.send(["go \udfff"], [0])
        r = p.recv()
        assert "actions[0] is not valid text" in r.error[0]
        p.close()


def test_absurd_num_envs_is_refused_before_allocating():
    with pytest.raises(ValueError, match="num_envs: at most"):
        EnvPool("dummy", 10**8)
    native = _native.require("_envpool")
    with pytest.raises(ValueError, match="num_envs: at most"):
        native.EnvPool("dummy", 10**8)
    with pytest.raises(ValueError, match="num_envs: at most"):
        native.EnvPool("dummy", 2**21, group_size=2**21)
