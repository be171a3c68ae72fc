"""Shared test configuration.

Tests that need optional parts (the real alfworld package, vLLM, ALFWORLD_DATA) skip with a
visible reason when those are absent on a developer's machine; under CI (``CI`` set) a missing
package is an error instead, so CI can never go green by skipping them.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _need_module(name: str, why: str) -> None:
    if importlib.util.find_spec(name) is None:
        msg = f"{why}: the '{name}' package is not installed"
        if IN_CI:
            pytest.fail(msg + " (required under CI; .ci/run installs it)", pytrace=False)
        pytest.skip(msg)


@pytest.fixture(scope="session")
def alfworld_data() -> Path:
    """Root of the real ALFWorld games ($ALFWORLD_DATA); skips when unset."""
    root = os.environ.get("ALFWORLD_DATA")
    if not root:
        if IN_CI:
            pytest.fail("ALFWORLD_DATA is not set under CI", pytrace=False)
        pytest.skip("ALFWORLD_DATA is not set (point it at the folder holding json_2.1.1/)")
    path = Path(root)
    if not (path / "json_2.1.1").is_dir():
        pytest.fail(f"ALFWORLD_DATA={root} has no json_2.1.1/ folder", pytrace=False)
    return path


@pytest.fixture(scope="session")
def webshop_data() -> Path:
    """The shared WebShop folder ($WEBSHOP_DATA: data/, facts/, traces_public.jsonl.gz); skips when
    unset, fails when unset under CI."""
    root = os.environ.get("WEBSHOP_DATA")
    if not root:
        if IN_CI:
            pytest.fail("WEBSHOP_DATA is not set under CI", pytrace=False)
        pytest.skip("WEBSHOP_DATA is not set (point it at the shared webshop/ folder holding data/ and facts/)")
    path = Path(root)
    if not (path / "data" / "items_shuffle_1000.json").is_file():
        pytest.fail(f"WEBSHOP_DATA={root} has no data/items_shuffle_1000.json", pytrace=False)
    return path


@pytest.fixture(scope="session")
def real_alfworld() -> None:
    """The real alfworld engine (oracle for the native one); skips when absent outside CI."""
    _need_module("alfworld", "differential test against the real ALFWorld engine")
    _need_module("textworld", "differential test against the real ALFWorld engine")


@pytest.fixture(scope="session")
def gymnasium_available() -> None:
    _need_module("gymnasium", "Gymnasium text environment test")


@pytest.fixture(scope="session")
def textarena_available() -> None:
    _need_module("textarena", "TextArena game test (pip install '.[textarena]')")


@pytest.fixture(scope="session")
def openenv_available() -> None:
    for name in ("openenv", "websockets", "uvicorn"):
        _need_module(name, "OpenEnv server test (pip install '.[openenv]')")


@pytest.fixture(scope="session")
def vllm_available() -> None:
    _need_module("vllm", "vLLM backend test")


@pytest.fixture(scope="session")
def child_env() -> dict[str, str]:
    """Environment for child Python processes (``python -m pcsd.…``) that must import the same pcsd
    as this test process: the installed, compiled one under CI, the source tree after an in-place
    build. Run them with ``cwd`` outside the repository, or ``-m`` puts the source tree first."""
    import pcsd

    root = os.path.dirname(os.path.dirname(os.path.abspath(pcsd.__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    """The generated tiny model the update, LoRA, method and GPU-path tests share (hidden size 64,
    2 layers, seed 3), made once per session. Tests read it; one that changes a model copies it."""
    from pcsd.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "m", hidden_size=64, num_layers=2, seed=3)


# ----------------------------------------------------------------------------- short runs
#: the overrides of a short run on the tiny model (python -m pcsd.train): no warm-up, one task of two
#: one-step plays with four-token answers, one evaluation game, two RL steps each checkpointed, a
#: one-layer tiny model when no model.path is given. :func:`tiny_run` changes and adds to them.
TINY_RUN = (
    "rollout.backend=hf",
    "optim.sft_steps=0",
    "env.max_steps=1",
    "rollout.tasks_per_step=1",
    "rollout.group_size=2",
    "rollout.max_response_tokens=4",
    "eval.episodes=1",
    "optim.steps=2",
    "run.save_every=1",
    "model.tiny_layers=1",
)


def tiny_run(*overrides: str, leave_out: tuple[str, ...] = ()) -> list[str]:
    """:data:`TINY_RUN` with ``overrides`` (``key=value``): one naming a key of it takes that key's
    place, the others follow in order; ``leave_out``: keys of it not given (e.g. ``env.max_steps``
    when the env's keys set it before)."""
    given = dict(o.split("=", 1) for o in overrides)
    out = []
    for o in TINY_RUN:
        key = o.split("=", 1)[0]
        if key not in leave_out:
            out.append(f"{key}={given.pop(key)}" if key in given else o)
    return out + [o for o in overrides if o.split("=", 1)[0] in given]


# ----------------------------------------------------------------------------- processes of several ranks
#: how long a run of several ranks (gloo processes) may take before it counts as a hang
RANKS_TIMEOUT_S = 300.0


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the ranks' MASTER_PORT)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _traced_rank(rank: int, fn, *args) -> None:
    """One rank of :func:`spawn_ranks`: ``fn(rank, *args)``, its Python stacks dumped to stderr on SIGUSR1."""
    import faulthandler
    import signal
    import sys

    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    fn(rank, *args)


def spawn_ranks(fn, args: tuple, nprocs: int = 2, timeout_s: float = RANKS_TIMEOUT_S) -> None:
    """``torch.multiprocessing.spawn(fn, args, nprocs)`` with a deadline. A rank that raises fails the
    test with its traceback (as ``spawn`` does); ranks still running after ``timeout_s`` (one waiting
    on a collective another never joins) print their Python stacks to stderr (the test's captured
    output, with the ranks' own), are killed, and the test fails with one line saying which."""
    import signal
    import time

    import torch.multiprocessing as mp

    ranks = mp.start_processes(_traced_rank, args=(fn, *args), nprocs=nprocs, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout_s
    while not ranks.join(timeout=1.0):
        if time.monotonic() < deadline:
            continue
        alive = [r for r, p in enumerate(ranks.processes) if p.is_alive()]
        for r in alive:
            os.kill(ranks.processes[r].pid, signal.SIGUSR1)
        time.sleep(2.0)  # the stacks are written
        for p in ranks.processes:
            if p.is_alive():
                p.kill()
            p.join()
        pytest.fail(
            f"rank(s) {', '.join(map(str, alive))} of {nprocs} still running after {timeout_s:.0f} s (a hang: each "
            "rank's Python stack follows its output in the captured stderr)",
            pytrace=False,
        )
