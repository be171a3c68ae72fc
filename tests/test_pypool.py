"""The pool of Python text environments (pcsd.envs.pypool): the native pool's results and rules
(groups, step limit, auto-reset, per-env errors), checked against a plain in-process reference on
random call sequences, one test per rule and per fault (an env that raises, hangs, exits or
segfaults; a result outside the protocol), process hygiene (Ctrl-C, a killed parent), and the
env check that the config runs (pcsd.envs.pypool.check_env)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pcsd.envs.protocol import EnvBuildError, EnvFactory, ProtocolError
from pcsd.envs.pypool import EnvWorkers, PythonEnvPool, check_env, play_experts

HERE = Path(__file__).resolve().parent
COUNTER = EnvFactory("textenv_faults:Counter")


def f(name: str, **kw) -> EnvFactory:
    return EnvFactory(f"textenv_faults:{name}", kwargs=kw)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


# ----------------------------------------------------------------------------- the plain reference
class Reference:
    """The pool's rules, written plainly: the envs in this process, one call after another."""

    def __init__(self, make_env, n, group, seeds, max_steps, threshold, auto_reset):
        self.envs = [make_env() for _ in range(n)]
        self.seeds, self.group, self.max_steps = seeds, group, max_steps
        self.threshold, self.auto_reset = threshold, auto_reset
        self.state = ["new"] * n
        self.score, self.steps, self.task = [0.0] * n, [0] * n, [""] * n

    def _reset(self, e):
        obs, info = self.envs[e].reset(seed=self.seeds[e // self.group], options=None)
        self.state[e], self.score[e], self.steps[e] = "live", 0.0, 0
        self.task[e] = info.get("task", obs)
        return (obs, info.get("admissible_actions", []), 0.0, 0.0, False, bool(info.get("won", False)), False, 0, "")

    def reset(self, ids):
        return [self._reset(e) for e in ids]

    def step(self, ids, actions):
        out = []
        for e, a in zip(ids, actions):
            if not 0 <= e < len(self.envs):
                out.append(("", [], 0.0, 0.0, True, False, False, 0, "error"))
            elif self.state[e] == "done" and self.auto_reset:
                out.append(self._reset(e))
            elif self.state[e] != "live":
                out.append(("", [], 0.0, 0.0, True, False, False, 0, "error"))
            else:
                obs, r, term, trunc, info = self.envs[e].step(a)
                self.steps[e] += 1
                self.score[e] += r
                limit = self.max_steps is not None and self.steps[e] >= self.max_steps
                done = term or trunc or limit
                if done:
                    self.state[e] = "done"
                won = (
                    info["won"]
                    if "won" in info
                    else (done and self.threshold is not None and self.score[e] >= self.threshold)
                )
                out.append(
                    (
                        obs,
                        info.get("admissible_actions", []),
                        r,
                        self.score[e],
                        done,
                        won,
                        trunc or (limit and not term),
                        self.steps[e],
                        "",
                    )
                )
        return out


def rows(b):
    return [
        (
            b.obs[k],
            b.admissible[k],
            float(b.reward[k]),
            float(b.score[k]),
            bool(b.done[k]),
            bool(b.won[k]),
            bool(b.truncated[k]),
            int(b.step_count[k]),
            "error" if b.error[k] else "",
        )
        for k in range(len(b))
    ]


@pytest.fixture(scope="module")
def counter_workers():
    with EnvWorkers(f("Counter", length=3, won=False), 2) as w:
        yield w


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_pool_equals_the_plain_reference_on_random_calls(counter_workers, data):
    group = data.draw(st.sampled_from([1, 2, 3]))
    n = group * data.draw(st.integers(1, 3))
    seeds = data.draw(st.lists(st.integers(0, 50), min_size=n // group, max_size=n // group))
    max_steps = data.draw(st.sampled_from([None, 1, 2, 5]))
    threshold = data.draw(st.sampled_from([None, 1.0, 2.5]))
    auto = data.draw(st.booleans())
    ref = Reference(f("Counter", length=3, won=False), n, group, seeds, max_steps, threshold, auto)
    with PythonEnvPool(
        counter_workers,
        n,
        group_size=group,
        seeds=seeds,
        max_steps=max_steps,
        success_threshold=threshold,
        auto_reset=auto,
    ) as pool:
        for _ in range(data.draw(st.integers(1, 8))):
            ids = data.draw(st.lists(st.integers(0, n), unique=True, min_size=1, max_size=n + 1))
            if data.draw(st.integers(0, 4)) == 0:
                ids = [e for e in ids if e < n] or [0]
                assert rows(pool.reset(ids)) == ref.reset(ids)
            else:
                acts = data.draw(st.lists(st.sampled_from(["go", "stop", "x"]), min_size=len(ids), max_size=len(ids)))
                assert rows(pool.step(acts, ids)) == ref.step(ids, acts)
            for e in range(n):
                if ref.state[e] != "new":
                    assert pool.task_of(e)[1] == ref.task[e]


# ----------------------------------------------------------------------------- one test per rule
def test_groups_share_their_task_and_seed():
    with PythonEnvPool(COUNTER, 6, group_size=3, seeds=[7, 8], num_workers=2) as pool:
        b = pool.reset()
        assert b.obs == ["7:0:"] * 3 + ["8:0:"] * 3
        assert [pool.task_of(e) for e in range(6)] == [("count", "count 7")] * 3 + [("count", "count 8")] * 3
    with PythonEnvPool(COUNTER, 4, group_size=2, seed=100, num_workers=1) as pool:  # default: seed + g
        assert pool.reset().obs == ["100:0:", "100:0:", "101:0:", "101:0:"]


def test_step_limit_ends_the_episode_as_truncated():
    with PythonEnvPool(f("Counter", length=10), 2, max_steps=2, num_workers=1) as pool:
        pool.reset()
        s = pool.step(["go", "go"])
        assert not s.done.any()
        s = pool.step(["go", "stop"])
        assert s.done.all() and s.truncated.all() and s.step_count.tolist() == [2, 2]
    with PythonEnvPool(f("Counter", length=2), 1, max_steps=2, num_workers=1) as pool:  # the env ends it first
        pool.reset()
        pool.step(["go"])
        s = pool.step(["go"])
        assert s.done[0] and not s.truncated[0] and s.won[0]


def test_auto_reset_off_finished_envs_wait_for_reset():
    with PythonEnvPool(f("Counter", length=1), 2, num_workers=1) as pool:
        pool.reset()
        assert pool.step(["go", "go"]).done.all()
        s = pool.step(["go", "go"], [0, 1])
        assert all("finished its episode" in e for e in s.error) and s.done.all()
        assert pool.reset([1]).obs == ["1:0:"]
        s = pool.step(["go", "go"])
        assert s.error[0] and not s.error[1]


def test_auto_reset_on_the_next_step_resets():
    with PythonEnvPool(f("Counter", length=1), 1, auto_reset=True, num_workers=1) as pool:
        pool.reset()
        assert pool.step(["stop"]).done[0]
        s = pool.step(["ignored"])
        assert s.obs == ["0:0:"] and s.step_count[0] == 0 and s.reward[0] == 0 and not s.done[0]


def test_won_is_the_envs_or_the_threshold():
    with PythonEnvPool(f("Counter", length=2), 2, num_workers=1) as pool:  # info["won"]: all actions "go"
        pool.reset()
        pool.step(["go", "stop"])
        assert pool.step(["go", "go"]).won.tolist() == [True, False]
    for threshold, won in ((2.0, True), (2.5, False), (None, False)):
        with PythonEnvPool(f("Counter", length=2, won=False), 1, num_workers=1, success_threshold=threshold) as pool:
            pool.reset()
            assert not pool.step(["x"]).won[0]  # not done yet
            s = pool.step(["x"])
            assert s.score[0] == 2.0 and s.won[0] == won


def test_task_falls_back_to_the_first_observation_and_actions_to_none():
    with PythonEnvPool(f("NoTask"), 1, seeds=[5], num_workers=1) as pool:
        b = pool.reset()
        assert pool.task_of(0) == ("count", "5:0:") and b.admissible == [[]]
        assert pool.step(["go"]).admissible == [[]]


def test_reset_options_reach_the_env():
    with PythonEnvPool(COUNTER, 1, num_workers=1, options={"split": "eval"}) as pool:
        pool.reset()
        assert pool.task_of(0)[1] == "count 0 [('split', 'eval')]"


# ----------------------------------------------------------------------------- faults
def _fault_pool(name: str, **kw):
    # 4 envs on ONE worker, env 1 (seed 13) faults at its 2nd step: the others share its process
    return PythonEnvPool(f(name, length=4), 4, seeds=[12, 13, 14, 15], num_workers=1, **kw)


def _play_past_the_fault(pool: PythonEnvPool) -> list:
    pool.reset()
    first = pool.step(["go"] * 4)
    assert not any(first.error)
    second = pool.step(["go"] * 4)
    return [first, second, pool.step(["go", "go", "go", "go"])]


@pytest.mark.parametrize(
    "name,what",
    [
        ("Raises", "step() raised RuntimeError: boom at step 2"),
        ("Hangs", "did not return within 1 s"),
        ("Exits", "worker process died (exit code 3)"),
        ("Segfaults", "worker process died (signal 11)"),
    ],
)
def test_a_faulty_env_ends_only_its_own_episode(name, what):
    """An exception, a hang, an exit or a segfault in env 1 is env 1's error (done, empty obs, its
    episode over); envs 0, 2, 3 on the same worker get exactly what they would have got."""
    with _fault_pool(name, step_timeout=1.0) as pool:
        pids = pool.workers.pids()
        _, second, third = _play_past_the_fault(pool)
        assert what in second.error[1] and second.done[1] and second.obs[1] == "" and second.reward[1] == 0
        assert second.error[0] == second.error[2] == second.error[3] == ""
        assert second.obs[0] == "12:2:go" and second.obs[3] == "15:2:go" and second.step_count[2] == 2
        assert third.obs[0] == "12:3:go" and third.obs[2] == "14:3:go"  # the others play on
        assert "broken by an earlier error" in third.error[1]
        if name != "Raises":
            assert pool.workers.pids() != pids  # replaced
            assert not alive(pids[0])
        assert pool.reset([1]).obs == ["13:0:"]  # a reset mends it


def test_envs_idle_when_their_worker_died_are_rebuilt_before_their_next_step():
    with _fault_pool("Exits") as pool:
        pool.reset()
        pool.step(["go"] * 4)
        s = pool.step(["go", "go"], [1, 2])  # env 1 kills the worker; env 0 and 3 were idle
        assert s.error[0] and not s.error[1]
        s = pool.step(["stop", "go"], [0, 3])
        assert s.obs == ["12:2:stop", "15:2:go"] and not any(s.error)


def test_an_env_that_does_not_replay_to_its_state_is_an_error_not_a_silent_change():
    with PythonEnvPool(f("NotDeterministic", length=5), 2, seeds=[12, 13], num_workers=1) as pool:
        pool.reset()
        pool.step(["go", "go"])
        os.kill(pool.workers.pids()[0], signal.SIGKILL)  # the worker dies while idle
        time.sleep(0.2)
        s = pool.step(["go", "go"])
        assert all("not deterministic for a seed" in e for e in s.error)


@pytest.mark.parametrize(
    "name,what",
    [
        ("NonText", "returned an observation of type int, expected str"),
        ("OldGymStep", "step() returned a tuple of 4"),
        ("BadInfo", "info['admissible_actions'] of type str"),
        ("BadAnchor", "info['anchor'] of type int, expected str"),
    ],
)
def test_results_outside_the_protocol_are_that_envs_error(name, what):
    with PythonEnvPool(f(name), 2, seeds=[12, 13], num_workers=1) as pool:
        b = pool.reset()
        if name == "BadInfo":
            assert all(what in e for e in b.error)
            return
        s = pool.step(["go", "go"])
        if name == "NonText":  # only env 1 (the bad seed) returns a number
            assert not s.error[0] and what in s.error[1] and s.done[1]
        else:
            assert all(what in e for e in s.error) and s.done.all()


def test_anchors_are_the_envs_info_anchor_or_none():
    with PythonEnvPool(f("Anchored"), 2, group_size=2, seeds=[3], num_workers=1) as pool:
        assert pool.reset().anchor == ["0", "0"]
        s = pool.step(["go", "stop"])
        assert s.anchor == ["1", "1"] and s.obs == ["3:1:go", "3:1:stop"]
    with PythonEnvPool(COUNTER, 1, num_workers=1) as pool:
        assert pool.reset().anchor == [None]


def test_malformed_calls_raise_and_bad_entries_are_errors():
    with PythonEnvPool(COUNTER, 2, num_workers=1) as pool:
        pool.reset()
        with pytest.raises(ValueError, match="env_ids: env 1 appears twice"):
            pool.step(["go", "go"], [1, 1])
        with pytest.raises(ValueError, match="actions: expected one action per env id"):
            pool.step(["go"], [0, 1])
        with pytest.raises(ValueError, match="actions: without env_ids"):
            pool.step(["go"])
        s = pool.step(["go", "go", "\ud800"], [5, 0, 1])
        assert "out of range" in s.error[0] and not s.error[1] and "lone surrogate" in s.error[2]
        with pytest.raises(ValueError, match="seeds: expected one seed per group"):
            PythonEnvPool(COUNTER, 2, seeds=[1, 2, 3])
        with pytest.raises(ValueError, match="num_envs: must be a multiple of group_size"):
            PythonEnvPool(COUNTER, 3, group_size=2)
    with pytest.raises(RuntimeError, match="closed"):
        pool.step(["go", "go"])
    with pytest.raises(ValueError, match="make_env: must be picklable"):
        EnvWorkers(lambda: None, 1)


def test_spin_s_is_checked_before_any_worker_starts_and_0_never_polls(monkeypatch):
    """``EnvWorkers(spin_s=...)``: seconds in [0, SPIN_UNTIL], else one line naming it (no process
    started); ``spin_s=0`` waits for a lone worker asleep on its socket, never polling it."""
    from pcsd.envs import pypool

    started = []
    monkeypatch.setattr(EnvWorkers, "_start", lambda self, w: started.append(w))
    for bad in (-1e-6, True, pypool.SPIN_UNTIL * 2, "0", float("nan")):
        with pytest.raises(ValueError, match=r"^spin_s: expected seconds in \[0, "):
            EnvWorkers(COUNTER, 1, spin_s=bad)
    assert started == []
    monkeypatch.undo()

    def no_polling(fd, seconds):
        raise AssertionError(f"polled for {seconds} s")

    monkeypatch.setattr(pypool, "answered_within", no_polling)
    with EnvWorkers(COUNTER, 1, spin_s=0) as w, PythonEnvPool(w, 1, auto_reset=True) as pool:
        pool.reset()
        for _ in range(40):  # past the wait choice's warm-up and exploring calls
            assert not pool.step(["go"]).error[0]


def test_pool_over_shared_workers_leaves_them_running():
    with EnvWorkers(COUNTER, 1) as workers:
        with PythonEnvPool(workers, 2) as pool:
            pool.reset()
        assert not workers.closed and all(alive(p) for p in workers.pids())
        with PythonEnvPool(workers, 3, seed=40) as pool:  # a new layout over the same processes
            assert pool.reset().obs == ["40:0:", "41:0:", "42:0:"]
        pids = workers.pids()
    assert not any(alive(p) for p in pids)


def test_expert_episodes():
    with PythonEnvPool(f("Counter", length=3), 2, seeds=[1, 2], num_workers=1) as pool:
        eps = play_experts(pool)
    assert [len(e.steps) for e in eps] == [3, 3] and all(e.won for e in eps)
    assert eps[0].task == "count 1" and eps[0].steps[1] == ("1:1:go", ["go", "stop"], "go")


# ----------------------------------------------------------------------------- no process left behind
_SCRIPT = """
import os, signal, sys, threading, time
sys.path.insert(0, {here!r})
from pcsd.envs.protocol import EnvFactory
from pcsd.envs.pypool import PythonEnvPool
pool = PythonEnvPool(EnvFactory("textenv_faults:Hangs", kwargs={{"bad_seed": 0, "at": 1}}), 2, num_workers=2,
                     seeds=[0, 1])
pool.reset()
print(" ".join(map(str, pool.workers.pids())), flush=True)
{then}
"""


def test_ctrl_c_during_a_call_ends_every_worker(tmp_path):
    """Deterministic: SIGINT's default action in the child whatever the calling shell set (a
    background job of a non-interactive shell ignores SIGINT), and the signal is sent once the hung
    env says it is hung (a file), not after a sleep."""
    then = textwrap.dedent("""
        mark = os.environ["PCSD_TEST_HANG_MARK"]

        def interrupt_when_hung():
            while not any(p.startswith(os.path.basename(mark) + ".") for p in os.listdir(os.path.dirname(mark))):
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGINT)

        threading.Thread(target=interrupt_when_hung, daemon=True).start()
        try:
            pool.step(["go", "go"])
        except KeyboardInterrupt:
            print("interrupted", pool.closed, flush=True)
    """)
    r = subprocess.run(
        [sys.executable, "-c", _SCRIPT.format(here=str(HERE), then=then)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=HERE.parent,
        env=dict(os.environ, PCSD_TEST_HANG_MARK=str(tmp_path / "hung")),
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    lines = r.stdout.split("\n")
    assert lines[1] == "interrupted True", r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert not any(alive(int(p)) for p in lines[0].split())


def test_workers_end_when_their_parent_is_killed():
    then = "pool.step(['go', 'go'])  # hangs"
    proc = subprocess.Popen(
        [sys.executable, "-c", _SCRIPT.format(here=str(HERE), then=then)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=HERE.parent,
    )
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert pids and all(alive(p) for p in pids)
    time.sleep(0.5)
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 10
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in pids)


# ----------------------------------------------------------------------------- the config's env check
def test_check_env_reports_the_env():
    c = check_env(f("Counter"))
    assert (c.task, c.observation, c.admissible, c.action, c.has_expert) == (
        "count 0",
        "0:0:",
        ["go", "stop"],
        "go",
        True,
    )


@pytest.mark.parametrize(
    "factory,stage,what",
    [
        (EnvFactory("no_such_pkg_xyz:Env"), "import", "no module named 'no_such_pkg_xyz'"),
        (EnvFactory("textenv_faults:Nope"), "import", "has no attribute 'Nope'"),
        (EnvFactory("textenv_faults:HERE_IS_NOT"), "import", "has no attribute"),
        (EnvFactory("textenv_faults"), "import", "expected 'module:Class'"),
        (EnvFactory("textenv_faults:NeedsArg"), "construct", "missing 1 required positional argument: 'size'"),
        (EnvFactory("textenv_faults:Counter", kwargs={"colour": 1}), "construct", "unexpected keyword argument"),
        (EnvFactory("textenv_faults:not_a_class"), "construct", "ValueError: cannot build this one"),
        (EnvFactory(id="NoSuchEnv-v9"), "import", "NoSuchEnv"),
    ],
)
def test_check_env_build_errors_name_their_stage(factory, stage, what):
    if factory.id is not None:
        pytest.importorskip("gymnasium")
    with pytest.raises(EnvBuildError, match=None) as ei:
        check_env(factory)
    assert ei.value.stage == stage and what in str(ei.value) and "\n" not in str(ei.value)


@pytest.mark.parametrize(
    "name,kw,what",
    [
        ("NonText", {"bad_seed": 0, "at": 1}, "observation of type int, expected str"),
        ("Raises", {"bad_seed": 0, "at": 0}, "reset() raised RuntimeError: boom"),
        ("Raises", {"bad_seed": 0, "at": 1}, "step('go') raised RuntimeError"),
        ("Hangs", {"bad_seed": 0, "at": 1}, "did not return within 1 s"),
        ("Exits", {"bad_seed": 0, "at": 0}, "worker process died (exit code 3)"),
        ("BadInfo", {}, "info['admissible_actions'] of type str"),
    ],
)
def test_check_env_protocol_errors_are_one_line(name, kw, what):
    with pytest.raises(ProtocolError) as ei:
        check_env(f(name, **kw), timeout=1.0)
    assert what in str(ei.value) and "\n" not in str(ei.value)


def test_step_batch_columns_have_the_native_types():
    with PythonEnvPool(COUNTER, 2, num_workers=1) as pool:
        b = pool.reset()
    for name, dtype in (
        ("env_id", np.int64),
        ("reward", np.float64),
        ("score", np.float64),
        ("done", np.bool_),
        ("won", np.bool_),
        ("truncated", np.bool_),
        ("step_count", np.int64),
        ("has_search_bar", np.bool_),
    ):
        assert getattr(b, name).dtype == dtype, name


def test_bench_env_python_reports_overhead_and_scaling(tmp_path):
    """``python -m pcsd.bench env --python`` (tiny sizes): the overhead rows (wall and CPU, per env
    step, against the plain loop) and the 1 -> 2 worker scaling rows."""
    import json

    from pcsd.bench.cli import main as bench_main

    bench_main(["env", "--python", "--tiny", "--repeats", "1", "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "env_python.json").read_text())["rows"]
    over = [r for r in rows if r["measure"].startswith("overhead")]
    scale = [r for r in rows if r["measure"].startswith("scaling")]
    assert over and all(r["pool_us_per_step"] > 0 and "cpu_overhead_us_per_step" in r for r in over)
    assert [r["workers"] for r in scale] == [1, 2] and scale[0]["speedup_vs_1_worker"] == 1.0
    assert scale[1]["speedup_vs_1_worker"] > 0


def test_hung_envs_of_a_worker_time_out_together():
    """4 envs of one worker hang at the same step: one ``step_timeout`` (and a fraction per further
    hung env), not 4 one after another (issue 30, part 3); every other env of the worker plays on."""
    timeout = 3.0
    # 8 envs on one worker: group 1 (seed 13, envs 4..7) hangs at its 2nd step, group 0 (seed 12) not
    with PythonEnvPool(
        f("Hangs", length=4), 8, group_size=4, seeds=[12, 13], num_workers=1, step_timeout=timeout
    ) as pool:
        pool.reset()
        assert not any(pool.step(["go"] * 8).error)
        t0 = time.monotonic()
        s = pool.step(["go"] * 8)
        took = time.monotonic() - t0
        assert all("did not return within 3 s" in e for e in s.error[4:]) and not any(s.error[:4])
        assert s.obs[:4] == ["12:2:go"] * 4
        assert took < 2 * timeout, took  # one after another: >= 4 * timeout
        third = pool.step(["go"] * 4, [0, 1, 2, 3])  # replayed on the worker that replaced it
        assert third.obs == ["12:3:go"] * 4 and not any(third.error)


def test_text_that_is_not_valid_unicode_is_that_envs_error():
    """A lone surrogate in an observation (a str no UTF-8 can hold) is that env's error, the others
    play on (before: the type check passed it, and the prompt builder's failure ended the run); the
    config's env check says so in one line."""
    with PythonEnvPool(f("Surrogate", at=1), 2, seeds=[12, 13], num_workers=1) as pool:
        pool.reset()
        s = pool.step(["go", "go"])
        assert not s.error[0] and s.obs[0] == "12:1:go"
        assert "returned an observation that is not valid text ('\\ud800' at position 7" in s.error[1] and s.done[1]
    with pytest.raises(ProtocolError, match=r"step\('go'\) returned an observation that is not valid text"):
        check_env(f("Surrogate", bad_seed=0, at=1))


def test_a_call_to_one_worker_polls_its_socket_then_sleeps_with_the_same_results(monkeypatch):
    """The wait for one worker's answer (``EnvWorkers(spin_s=...)``, default pcsd.envs.pypool.SPIN_S):
    ``answered_within`` sees an answer that is there and gives up after its window; the pool's
    results with polling equal those of the plain sleeping wait (spin_s = 0) and the in-process
    reference; a worker that took longer than SPIN_UNTIL is waited for asleep, without a poll."""
    import socket

    from pcsd.envs import pypool

    a, b = socket.socketpair()
    with a, b:
        t0 = time.perf_counter()
        assert not pypool.answered_within(a.fileno(), 0.01) and time.perf_counter() - t0 >= 0.01
        assert not pypool.answered_within(a.fileno(), 0.0)
        b.send(b"x")
        assert pypool.answered_within(a.fileno(), 0.0) and pypool.answered_within(a.fileno(), 10.0)
    calls = [(None, [0, 1, 2]), (["go", "stop", "go"], None), (["go", "go"], [0, 2]), (None, [1]), (["x"], [1])]
    calls += [(["go"] * 3, None)] * 20  # past the choice's warm-up: both ways measured
    got = {}
    for spin in (pypool.SPIN_S, 0.0):
        ref = Reference(f("Counter", length=3), 3, 1, [4, 5, 6], None, None, True)
        with (
            EnvWorkers(f("Counter", length=3), 1, spin_s=spin) as w,
            PythonEnvPool(w, 3, seeds=[4, 5, 6], auto_reset=True) as pool,
        ):
            got[spin] = []
            for acts, ids in calls:
                b_ = pool.reset(ids) if acts is None else pool.step(acts, ids)
                want = ref.reset(ids) if acts is None else ref.step(ids or [0, 1, 2], acts)
                assert rows(b_) == want
                got[spin].append(rows(b_))
            assert spin or pool.workers._wait.n[1] == 0  # spin_s = 0: never a poll
    assert got[pypool.SPIN_S] == got[0.0]
    spins = []
    real = pypool.answered_within
    monkeypatch.setattr(pypool, "answered_within", lambda fd, s: spins.append(s) or real(fd, s))
    busy = EnvFactory("pcsd.envs.toy:DirectionEnv", kwargs={"episode_len": 100, "busy_iters": 100_000})  # ~10 ms
    with EnvWorkers(busy, 1, spin_s=1e-4) as w, PythonEnvPool(w, 1) as slow:
        slow.reset()  # (a worker's first answer comes through the starting path)
        slow.step(["left"]), slow.step(["left"])
        assert slow.workers._last_wait >= pypool.SPIN_UNTIL  # ~10 ms of CPU in the env here
    assert spins == [1e-4]  # the first step polled; the slow env's second call sleeps at once


def test_the_wait_is_chosen_by_measurement():
    """``_WaitChoice``: both ways until each has WARM measurements, then the quicker one, the other
    tried every EXPLORE-th call; a way that turns slower loses its place."""
    from pcsd.envs.pypool import _WaitChoice

    c = _WaitChoice()
    first = []
    for _ in range(2 * c.WARM):
        polled = c.poll()
        first.append(polled)
        c.record(polled, 20e-6 if polled else 90e-6)
    assert sorted(first) == [False] * c.WARM + [True] * c.WARM
    ways = []
    for _ in range(4 * c.EXPLORE):
        polled = c.poll()
        ways.append(polled)
        c.record(polled, 20e-6 if polled else 90e-6)
    assert ways.count(False) == 4 and all(
        ways[k] is ((c.calls - len(ways) + k + 1) % c.EXPLORE != 0) for k in range(len(ways))
    )
    for _ in range(200):  # polling turns slow (a full machine): sleeping wins back
        polled = c.poll()
        c.record(polled, 300e-6 if polled else 90e-6)
    assert not c.poll() or c.calls % c.EXPLORE == 0
