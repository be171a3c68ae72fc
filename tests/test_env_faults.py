"""Faults in a user's env are seen, not silent or fatal (issue 30, part 3): each step with env
errors prints one line and ``env_errors.jsonl`` keeps them; ``eval.md`` / ``eval.json`` report env
errors and prompt overflows for every env kind; every evaluation env failing is one line naming the
env and its first error; a preset's ``env.kwargs`` belong to its own entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pcsd.train.config import ConfigError, load_config

HERE = Path(__file__).resolve().parent

QUICK = [
    "env.name=gym",
    "env.entry_point=textenv_faults:Flaky",
    "method=grpo",
    "optim.sft_steps=0",
    "optim.steps=1",
    "rollout.tasks_per_step=2",
    "rollout.group_size=2",
    "rollout.max_response_tokens=4",
    "rollout.backend=hf",
    "env.max_steps=3",
    "eval.episodes=2",
    "model.tiny_layers=1",
    "model.tiny_hidden_size=64",
    "run.progress=false",
    "run.tensorboard=false",
]


def test_env_errors_are_said_kept_and_reported(tmp_path, capsys, monkeypatch):
    """Every episode's second step raises: the step's line says how many and the first message,
    env_errors.jsonl has one line per error (step, env, seed, episode step, message), eval.md says
    how many evaluation episodes an env error ended and eval.json counts them."""
    from pcsd.train.cli import main

    monkeypatch.syspath_prepend(str(HERE))
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    assert main([*QUICK, "env.kwargs.fail_step=2", f"run.dir={run}"]) == 0
    out = capsys.readouterr().out
    said = [ln for ln in out.splitlines() if "env error(s)" in ln]
    assert len(said) == 1 and said[0].startswith("[pcsd] step 1: 4 env error(s) ended their episodes; the first, env 0")
    assert "step() raised ValueError: the floor gave way at step 2" in said[0]
    rows = [json.loads(x) for x in (run / "env_errors.jsonl").read_text().splitlines()]
    assert [r["env"] for r in rows] == [0, 1, 2, 3] and {r["step"] for r in rows} == {1}
    assert all(r["episode_step"] == 2 and "the floor gave way" in r["message"] for r in rows)
    assert all(isinstance(r["seed"], int) and 0 <= r["seed"] < 500_000_000 for r in rows)  # training seeds
    md = (run / "eval.md").read_text()
    assert "Episodes ended unwon by an env error: " in md and "(first: env 0: step() raised ValueError" in md
    doc = json.loads((run / "eval.json").read_text())
    assert doc["after"]["env_errors"] == 2 and doc["before"]["env_errors"] == 2
    # method=grpo has no teacher: its step line and summary show no gap, gate or rule (issue 30, part 5)
    (line,) = [ln for ln in out.splitlines() if ln.startswith("[pcsd] step 1/1 ")]
    assert " kl " in line and "gap" not in line and "gate" not in line
    assert "rule" not in json.loads((run / "summary.json").read_text())
    assert all("the floor gave way" in g["env_error"] for g in doc["after"]["games"])


def test_every_evaluation_env_failing_is_one_line(tmp_path, capsys, monkeypatch):
    """Every evaluation env fails at reset (the evaluation seeds are 10**9 and up): one line naming
    the env and its first error, exit 2, in the trainer and in ``python -m pcsd.eval`` (before: a
    traceback)."""
    from pcsd.eval.cli import main as eval_main
    from pcsd.train.cli import main

    monkeypatch.syspath_prepend(str(HERE))
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    assert main([*QUICK, "env.kwargs.fail_reset_from=1000000000", f"run.dir={run}"]) == 2
    text = capsys.readouterr().err
    err = [ln for ln in text.splitlines() if ln.startswith("pcsd.")]  # besides the libraries' progress bars
    assert (
        "Traceback" not in text
        and len(err) == 1
        and err[0].startswith("pcsd.train: every environment failed at reset (2 of gym ")
    ), err
    assert "e.g. environment 0: env 0: reset() raised RuntimeError: no such level 1000000000" in err[0]
    assert eval_main(["--model", str(run / "base-model"), "--backend", "hf", "--quiet", "--episodes", "2",
                      "--env", "name=gym", "--env", "entry_point=textenv_faults:Flaky",
                      "--env", "kwargs.fail_reset_from=1000000000", "--out", str(tmp_path / "e")]) == 2  # fmt: skip
    text = capsys.readouterr().err
    err = [ln for ln in text.splitlines() if ln.startswith("pcsd.")]
    assert "Traceback" not in text and len(err) == 1, text
    assert err[0].startswith("pcsd.eval: error: every environment failed at reset"), err


def test_a_presets_env_kwargs_belong_to_its_entry_point(monkeypatch):
    """``preset=tiny-cpu-gym env.entry_point=<another env>``: the preset's env.kwargs (colors=3, for
    its KeyDoorEnv) and its other settings of that class (skills) are not passed on (before: the
    user's constructor got colors=3 and had to accept **kwargs); the preset's own class named again
    keeps them; kwargs given on the command line stay."""
    monkeypatch.syspath_prepend(str(HERE))
    mine = load_config(["preset=tiny-cpu-gym", "env.entry_point=textenv_faults:Counter", "method=grpo"])
    assert mine.env.kwargs == {} and mine.env.skills_dir is None and mine.env.max_steps == 4  # the rest stays
    given = load_config(
        ["preset=tiny-cpu-gym", "env.entry_point=textenv_faults:Counter", "env.kwargs.length=2", "method=grpo"]
    )
    assert given.env.kwargs == {"length": 2}
    same = load_config(["preset=tiny-cpu-gym", "env.entry_point=examples.keydoor:KeyDoorEnv", "method=grpo"])
    assert same.env.kwargs == {"colors": 3} and same.env.skills_dir == "examples/keydoor_skills"
    with pytest.raises(ConfigError, match=r"env.kwargs=\{'colours': 3\}: .*unexpected keyword argument 'colours'"):
        load_config(["preset=tiny-cpu-gym", "env.entry_point=textenv_faults:Counter", "env.kwargs.colours=3"])
