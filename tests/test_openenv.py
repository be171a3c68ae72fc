"""pcsd.envs.openenv against a real OpenEnv server: ``tests/fixtures/openenv/guess_server.py`` is a
guessing game written with openenv-core's server API (pinned in the ``openenv`` extra), served by
uvicorn in its own process on 127.0.0.1. Episodes to the end, rewards, seeds, the invalid-action,
raise, hang, full-server and dead-server paths, and one test per class of bad input."""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import sys
from pathlib import Path

import pytest

from pcsd.envs.openenv import OpenEnvEnv, OpenEnvServer, check, inspect_server

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
FIXTURES = str(Path(__file__).parent / "fixtures" / "openenv")
APP = "guess_server:app"

for _pkg in ("openenv", "websockets", "uvicorn"):
    if importlib.util.find_spec(_pkg) is None:
        if IN_CI:
            pytest.fail(
                f"the '{_pkg}' package is not installed (required under CI; run.sh installs .[openenv])", pytrace=False
            )
        pytest.skip(f"the '{_pkg}' package is not installed (pip install '.[openenv]')", allow_module_level=True)


def one_line(e: pytest.ExceptionInfo[BaseException]) -> str:
    msg = str(e.value)
    assert "\n" not in msg and msg.strip() == msg and msg
    return msg


@pytest.fixture(scope="module")
def server() -> OpenEnvServer:
    with OpenEnvServer(APP, app_dir=FIXTURES) as s:
        yield s


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def play(env: OpenEnvEnv, seed: int) -> list[tuple]:
    """Binary search on the game's hints; the steps of one episode."""
    obs, info = env.reset(seed=seed)
    assert info == {"task": "Guess the number between 1 and 16 in at most 6 guesses."} and obs == info["task"]
    lo, hi, steps = 1, 16, []
    while True:
        guess = (lo + hi) // 2
        step = env.step(str(guess))
        steps.append((guess, *step))
        if step[2]:
            return steps
        lo, hi = (guess + 1, hi) if "higher" in step[0] else (lo, guess - 1)


def test_episodes_to_the_end(server: OpenEnvServer) -> None:
    spec = inspect_server(server.base_url)
    assert (spec.action_field, spec.observation_field, spec.task_field, spec.info_fields) == (
        "guess",
        "text",
        None,
        ("won",),
    )
    env = OpenEnvEnv(server.base_url)
    numbers = set()
    for seed in range(12):
        *middle, last = play(env, seed)
        assert all(
            r == 0.0 and not t and not tr and i == {"won": False, "invalid_move": False} for _, _, r, t, tr, i in middle
        )
        number, obs, reward, term, trunc, info = last
        assert (obs, reward, term, trunc, info) == ("Right!", 1.0, True, False, {"won": True, "invalid_move": False})
        assert len(middle) < 5
        numbers.add(number)
    assert len(numbers) > 5  # seeds draw different numbers
    assert play(env, 3) == play(OpenEnvEnv(server.base_url), 3)  # the same seed, the same episode
    assert env.state()["step_count"] == len(play(env, 4))
    env.close()


def test_lost_episode_and_reset_options(server: OpenEnvServer) -> None:
    env = OpenEnvEnv(server.base_url)
    env.reset(seed=0, options={"episode_id": "lost-one"})  # passed to the server env's reset
    assert env.state()["episode_id"] == "lost-one"
    target = play(env, 0)[-1][0]
    env.reset(seed=0)
    wrong = [g for g in range(1, 17) if g != target][:6]
    for i, g in enumerate(wrong):
        obs, reward, term, trunc, info = env.step(str(g))
        assert term == (i == 5) and reward == 0.0 and not info["won"]
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step("1")
    env.close()


def test_action_the_schema_rejects_is_an_invalid_move(server: OpenEnvServer) -> None:
    env = OpenEnvEnv(server.base_url)
    env.reset(seed=1)
    obs, reward, term, trunc, info = env.step("")  # GuessAction.guess has min_length=1
    assert (reward, term, trunc, info) == (0.0, False, False, {"invalid_move": True})
    assert obs.startswith("The environment rejected the action:") and "at least 1 character" in obs
    assert env.step("what") == (
        "'what' is not a number.",
        0.0,
        False,
        False,  # the game's own answer,
        {"won": False, "invalid_move": False},
    )  # with reward None
    obs, _, term, _, info = env.step("8")  # the episode goes on
    assert obs in ("Right!", "The number is higher.", "The number is lower.") and not info["invalid_move"]
    env.close()


def test_env_that_raises_on_the_server(server: OpenEnvServer) -> None:
    env = OpenEnvEnv(server.base_url)
    env.reset(seed=1)
    with pytest.raises(RuntimeError) as e:
        env.step("raise")
    assert "step failed (EXECUTION_ERROR): the guessing game broke on purpose" in one_line(e)
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step("3")
    assert env.reset(seed=1)[0].startswith("Guess the number")  # the env works on
    env.close()


def test_server_that_does_not_answer(server: OpenEnvServer) -> None:
    env = OpenEnvEnv(server.base_url, message_timeout_s=0.5)
    env.reset(seed=1)
    with pytest.raises(TimeoutError) as e:
        env.step("sleep 2")
    assert one_line(e).endswith("did not answer step in 0.5 s")
    assert env.reset(seed=2)[0].startswith("Guess the number")  # a new session
    env.close()


def test_concurrent_envs_and_a_full_server(server: OpenEnvServer) -> None:
    envs = [OpenEnvEnv(server.base_url) for _ in range(3)]
    for i, env in enumerate(envs):
        env.reset(seed=i)
    for env in envs:  # interleaved: each session keeps its own game
        env.step("1")
    assert [e.state()["step_count"] for e in envs] == [1, 1, 1]
    for env in envs:
        env.close()
    rules = server.base_url + "/rules"  # one session at a time
    first, second = OpenEnvEnv(rules, observation_field="text"), OpenEnvEnv(rules, observation_field="text")
    first.reset(seed=0)
    with pytest.raises(RuntimeError) as e:
        second.reset(seed=0)
    assert "is full (1 of 1 sessions): serve it with create_app(..., max_concurrent_envs=N)" in one_line(e)
    first.close()
    assert second.reset(seed=0)[0].startswith("Guess the number")  # room again
    second.close()


def test_observation_with_several_text_fields_and_a_task(server: OpenEnvServer) -> None:
    rules = server.base_url + "/rules"
    with pytest.raises(ValueError) as e:
        OpenEnvEnv(rules)
    assert one_line(e).endswith(
        "its observation RulesObservation has several text fields ['text', 'rules']; "
        "name the one pcsd reads with observation_field="
    )
    env = OpenEnvEnv(rules, observation_field="text")
    assert env.spec.task_field == "task"  # a field named like the protocol's key
    obs, info = env.reset(seed=2)
    assert (obs, info) == (
        "Guess the number between 1 and 16 in at most 6 guesses.",
        {"task": "Find the hidden number."},
    )
    assert "task" not in env.step("3")[4]
    env.close()
    env = OpenEnvEnv(rules, observation_field="text", task_field="rules")
    assert env.reset(seed=2)[1] == {"task": "One number per guess."}
    env.close()


def test_server_it_cannot_map(server: OpenEnvServer) -> None:
    for make in (check, OpenEnvEnv):
        with pytest.raises(ValueError) as e:
            make(server.base_url + "/grid")
        assert one_line(e).endswith(
            "its action MoveAction(x, y) has no text field; pcsd sends text actions "
            "and plays servers whose Action has one str field"
        )
    with pytest.raises(ValueError) as e:
        OpenEnvEnv(server.base_url, action_field="metadata")
    assert one_line(e).startswith("action_field 'metadata': GuessAction has no text field of that name")
    with pytest.raises(ValueError) as e:
        OpenEnvEnv(server.base_url, observation_field="guesses_left")
    one_line(e)


def test_wrong_addresses(server: OpenEnvServer) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    for make in (check, OpenEnvEnv):
        with pytest.raises(ConnectionError) as e:
            make(url)
        assert one_line(e).startswith(f"OpenEnv server at {url} is unreachable:")
    with pytest.raises(ValueError) as e:
        OpenEnvEnv(server.base_url + "/nothing")  # an HTTP server, but no OpenEnv app there
    assert one_line(e) == f"{server.base_url}/nothing is not an OpenEnv server (GET /health answered HTTP 404)"
    for bad in ("127.0.0.1:8000", "ftp://127.0.0.1", "http://"):
        with pytest.raises(ValueError) as e:
            check(bad)
        assert one_line(e).startswith("base_url must be an http(s):// or ws(s):// URL")
    with pytest.raises(ValueError) as e:
        OpenEnvEnv()
    one_line(e)
    with pytest.raises(ValueError) as e:
        OpenEnvEnv(server.base_url, message_timeout_s=0)
    assert one_line(e).startswith("message_timeout_s must be a number of seconds > 0")


def test_started_server_shared_and_dying_mid_episode() -> None:
    """``start=``: one server for the process's envs; SIGKILL it mid-episode -> one line from that
    env's step, and from the next reset."""
    env = OpenEnvEnv(start=APP, app_dir=FIXTURES)
    other = OpenEnvEnv(start=APP, app_dir=FIXTURES)
    server = env.server
    assert server is not None and other.server is server and server.alive
    env.reset(seed=5)
    env.step("8")
    other.close()
    assert server.alive  # env still uses it
    os.kill(server.process.pid, signal.SIGKILL)
    server.process.wait()
    with pytest.raises(ConnectionError) as e:
        env.step("4")
    assert one_line(e).startswith(f"OpenEnv server at {server.base_url} closed the connection during step")
    with pytest.raises(ConnectionError) as e:
        env.reset(seed=5)
    assert "is unreachable" in one_line(e)
    env.close()
    assert not server.alive and server.log_path is None


def test_start_errors() -> None:
    with pytest.raises(RuntimeError) as e:
        OpenEnvEnv(start="no_such_module_here:app", start_timeout_s=60)
    msg = one_line(e)
    assert msg.startswith("OpenEnv server 'no_such_module_here:app' exited with code")
    assert "no_such_module_here" in msg.split("before it was ready:", 1)[1]
    with pytest.raises(ValueError) as e:
        check(start="no_such_module_here:app")
    assert one_line(e).startswith("start 'no_such_module_here:app': no module 'no_such_module_here'")
    assert check(start=APP, app_dir=FIXTURES) is None
    with pytest.raises(ValueError) as e:
        check(start="guess_server")
    assert one_line(e).startswith("start must name an ASGI app as 'module:attribute'")


def test_missing_package_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "websockets.sync.client", None)  # as if websockets were absent
    for make in (check, OpenEnvEnv):
        with pytest.raises(ImportError) as e:
            make("http://127.0.0.1:1")
        msg = one_line(e)
        assert "'websockets' package" in msg and "pcsd[openenv]" in msg


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_started_server_ends_with_its_parent(child_env: dict[str, str], tmp_path: Path) -> None:
    """A process that started a server and is killed (no atexit, no stop()) leaves nothing behind:
    the server notices its parent is gone and exits."""
    import subprocess
    import time

    script = (
        "import sys, time\nfrom pcsd.envs.openenv import OpenEnvServer\n"
        f"s = OpenEnvServer('health_only:app', app_dir={FIXTURES!r}).start()\n"
        "print(s.process.pid, flush=True)\ntime.sleep(120)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=child_env, cwd=tmp_path
    )
    server_pid = 0
    try:
        server_pid = int(parent.stdout.readline())
        assert running(server_pid)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        while running(server_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not running(server_pid), f"the server (pid {server_pid}) outlived its parent by 10 s"
    finally:
        if parent.poll() is None:
            parent.kill()
        if server_pid and running(server_pid):
            os.kill(server_pid, signal.SIGKILL)
