"""The env's own privileged information for the teacher (issue 30, part 2): ``info["privileged"]``
goes into the teacher's prompt only (beside the skills when both), a step's info replaces it, the
student never sees it; a method with a teacher trains without a skills folder when the env gives
it; TextArena's games give their hidden state."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from conftest import tiny_run

from pcsd.envs.protocol import EnvFactory
from pcsd.text.prompts import PRIVILEGED_HEADER, PromptBuilder, SkillRepository
from pcsd.train.config import ConfigError, load_config

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SECRET = ["env.name=gym", "env.entry_point=textenv_secret:SecretDoor", "env.max_steps=3"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    from pcsd.rollout.backends import make_backend
    from pcsd.tiny_model import make_tiny_model

    sys.path.insert(0, str(HERE))  # the worker processes import the env by name, as a user's module
    path = make_tiny_model(tmp_path_factory.mktemp("tiny"), hidden_size=64, num_layers=1, seed=0)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    eos = PromptBuilder("text", tokenizer_dir=path).tokenizer.encode("<|im_end|>")[0]
    return path, make_backend("hf", model=model, pad_token_id=eos), eos


def _roll(tiny, skills=None, **env_kw):
    from pcsd.rollout.loop import collect_rollouts

    path, backend, eos = tiny
    builder = PromptBuilder("text", history_length=1, max_prompt_tokens=1024, tokenizer_dir=path, skills=skills)
    rb = collect_rollouts(
        backend,
        builder,
        [4, 5],
        2,
        max_steps=3,
        max_response_tokens=6,
        seed=2,
        stop_token_ids=[eos],
        env_kind="gym",
        env_options={"make_env": EnvFactory("textenv_secret:SecretDoor", kwargs=env_kw)},
    )
    dec = builder.tokenizer.decode
    return rb, [dec(p) for p in rb.prompt_ids], [dec(p) for p in rb.teacher_prompt_ids]


def test_the_teacher_reads_the_envs_privileged_text_and_the_student_never(tiny):
    import random

    rb, student, teacher = _roll(tiny)
    right = {seed: random.Random(seed).randrange(3) + 1 for seed in (4, 5)}
    for row, (s, t) in enumerate(zip(student, teacher)):
        seed = (4, 5)[int(rb.group_id[row])]
        secret = f"door {right[seed]} leads out" if int(rb.turn[row]) == 0 else f"still door {right[seed]}"
        assert secret in t and PRIVILEGED_HEADER in t, t
        assert "door " + str(right[seed]) + " leads" not in s and "still door" not in s and PRIVILEGED_HEADER not in s
        assert t.endswith(s.split("<|im_start|>user\n", 1)[1])  # then exactly the student's prompt
    assert any(int(t) > 0 for t in rb.turn)  # a later turn: the step's info replaced the text
    plain_rb, plain_s, plain_t = _roll(tiny, privileged=False)
    assert plain_s == plain_t  # no skills, no privileged text: the teacher's prompt is the student's


def test_privileged_text_sits_beside_the_skills(tiny, tmp_path):
    (tmp_path / "general.md").write_text("GENERAL SKILL")
    _, student, teacher = _roll(tiny, skills=SkillRepository(tmp_path, "text"))
    t = teacher[0]
    assert t.index("GENERAL SKILL") < t.index(PRIVILEGED_HEADER) < t.index("leads out")
    assert "GENERAL SKILL" not in student[0] and "leads out" not in student[0]


def test_a_teacher_needs_a_skills_folder_or_the_envs_privileged_text(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))
    assert load_config([*SECRET, "method=pcsd"]).env.skills_dir is None  # the env's own text suffices
    assert load_config([*SECRET, "method=rlsd"]).env.skills_dir is None
    with pytest.raises(ConfigError, match=r"env.skills_dir: method skill-grpo shows the skills in the student's"):
        load_config([*SECRET, "method=skill-grpo"])  # the student's prompts: the env's text is never theirs
    with pytest.raises(ConfigError, match=r"env.skills_dir: method pcsd-star shows the skills in the student's"):
        load_config([*SECRET, "method=pcsd-star"])
    with pytest.raises(ConfigError, match=r"env.skills_dir: method pcsd reads the teacher's skills.*privileged"):
        load_config([*SECRET, "env.kwargs.privileged=false", "method=pcsd"])


def one_step_args(run: Path) -> list[str]:
    """A one-step run on the tiny model, no warm-up, two groups of two (after the env and method
    keys: the env's env.max_steps stays; the preset's checkpoints)."""
    return tiny_run(
        "optim.steps=1",
        "rollout.tasks_per_step=2",
        "rollout.max_response_tokens=8",
        "rollout.max_prompt_tokens=512",
        "eval.episodes=2",
        "model.tiny_hidden_size=64",
        "run.progress=false",
        "run.tensorboard=false",
        f"run.dir={run}",
        leave_out=("env.max_steps", "run.save_every"),
    )


def test_pcsd_trains_on_an_env_that_gives_privileged_text_without_a_skills_folder(tmp_path, monkeypatch):
    from pcsd.train.cli import main

    monkeypatch.syspath_prepend(str(HERE))
    monkeypatch.chdir(HERE)
    run = tmp_path / "run"
    assert main([*SECRET, "method=pcsd", *one_step_args(run)]) == 0
    s = json.loads((run / "summary.json").read_text())
    assert s["method"] == "pcsd" and s["steps"] == 1 and s["success_after"] is not None
    assert not (run / "skills").exists()


def test_textarena_games_give_their_hidden_state(textarena_available):
    from pcsd.envs.textarena import TextArenaEnv

    env = TextArenaEnv("GuessTheNumber-v0")
    obs, info = env.reset(seed=3)
    secret = env._game.game_number
    assert info["privileged"] == f"The secret number is {secret}." and str(secret) not in obs
    _, _, _, _, info = env.step("[1]")
    assert info["privileged"] == f"The secret number is {secret}."
    mines = TextArenaEnv("Minesweeper-v0")
    assert "privileged" not in mines.reset(seed=1)[1]  # no mine is placed before the first move
    assert "The mines are at" in mines.step("[3 3]")[4]["privileged"]
    hanoi = TextArenaEnv("TowerOfHanoi-v0")  # the board is the whole state: nothing hidden
    assert "privileged" not in hanoi.reset(seed=0)[1]


def test_a_skills_folder_is_read_from_the_current_folder_and_only_when_read(tmp_path, monkeypatch):
    """``env.skills_dir=my_skills`` is the current folder's (before: the error named
    pcsd/train/configs/my_skills inside the package); under method=grpo nothing reads it, so it is
    not checked, only warned about (issue 30, part 5)."""
    import warnings

    from pcsd.train.config import ConfigWarning

    monkeypatch.chdir(tmp_path)
    # (the preset's template, examples/keydoor.jinja, is relative too: the built-in one here)
    gym = ["preset=tiny-cpu-gym", "env.entry_point=examples.keydoor:KeyDoorEnv", "env.template=null"]
    monkeypatch.syspath_prepend(str(ROOT))
    with pytest.raises(ConfigError) as ei:
        load_config([*gym, "method=pcsd", "env.skills_dir=my_skills"])
    assert str(tmp_path / "my_skills") in str(ei.value) and "pcsd/train/configs" not in str(ei.value)
    (tmp_path / "my_skills").mkdir()
    (tmp_path / "my_skills" / "general.md").write_text("Take the key first.")
    assert load_config([*gym, "method=pcsd", "env.skills_dir=my_skills"]).env.skills_dir == "my_skills"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = load_config([*gym, "method=grpo", "env.skills_dir=no/such/folder"])
    assert cfg.env.skills_dir == "no/such/folder"
    said = [str(w.message) for w in caught if issubclass(w.category, ConfigWarning)]
    assert said == ["env.skills_dir=no/such/folder has no effect under method=grpo: no teacher reads skills and the "
                    "student's prompts show none"]  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:  # the preset's own folder: no word (and not checked)
        warnings.simplefilter("always")
        load_config([*gym, "method=grpo"])
    assert not [w for w in caught if issubclass(w.category, ConfigWarning)]


# ----------------------------------------------------------------------------- issue 42
def test_a_steps_empty_privileged_text_clears_the_resets(tiny):
    """The docs: a step's text replaces the reset's, so ``info["privileged"] = ""`` after a step
    leaves the teacher without it: the pool carries the "" (PythonEnvPool), the rollout clears it."""
    from pcsd.envs.pypool import PythonEnvPool

    with PythonEnvPool(EnvFactory("textenv_secret:SecretDoor", kwargs={"clear": True}), 1, seeds=[5]) as pool:
        assert pool.reset().privileged == ["door 3 leads out"]  # random.Random(5).randrange(3) + 1
        assert pool.step(["open door 1"]).privileged == [""]  # the wrong door: the text cleared
    rb, student, teacher = _roll(tiny, clear=True)
    later = [k for k, t in enumerate(rb.turn.tolist()) if t > 0]
    assert later, "no later turn to check"
    for k, (s, t) in enumerate(zip(student, teacher)):
        if k in later:
            assert PRIVILEGED_HEADER not in t and t == s, t  # no skills, no text: the student's prompt
        else:
            assert PRIVILEGED_HEADER in t and "leads out" in t


def test_a_huge_privileged_text_is_cut_to_the_budget_with_one_line(tiny, capsys):
    """2 MB of info["privileged"] ended scoring with a 4 TB allocation: the teacher's prompt keeps the
    text's first rollout.max_privileged_tokens tokens (one stderr line on the first cut)."""
    import time

    from pcsd.text.prompts import DEFAULT_MAX_PRIVILEGED_TOKENS, PRIVILEGED_CUT

    path = tiny[0]
    req = dict(task="leave the room", observation="You see 3 doors.", admissible=["open door 1"])
    huge = "the exit is door 2. " * 100_000  # 2 MB
    pb = PromptBuilder("text", tokenizer_dir=path, max_privileged_tokens=16)
    t0 = time.perf_counter()
    (text, ids), (text2, ids2) = pb.build_batch([dict(req, privileged=huge), dict(req, privileged=huge)], teacher=True)
    assert time.perf_counter() - t0 < 5.0
    ((s_text, s_ids),) = pb.build_batch([req])
    assert text == text2 and PRIVILEGED_CUT.strip() in text and "the exit is door 2." in text
    cut = text[text.index(PRIVILEGED_HEADER) :].split("\n")[1]
    assert len(pb.tokenizer.encode(cut.removesuffix(PRIVILEGED_CUT))) <= 16
    assert len(ids) <= len(s_ids) + 16 + 40  # the block's header, footer and the cut mark
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "rollout.max_privileged_tokens" in err[0] and "first 16" in err[0], err
    assert pb.privileged_cuts == 1  # the same text is cut once
    short = "door 2 leads out"  # under the budget: unchanged, nothing said
    assert pb.build_teacher(req["task"], req["observation"], req["admissible"], privileged=short).count(short) == 1
    assert capsys.readouterr().err == ""
    assert PromptBuilder("text", tokenizer_dir=path).max_privileged_tokens == DEFAULT_MAX_PRIVILEGED_TOKENS
    whole = PromptBuilder("text", tokenizer_dir=path, max_privileged_tokens=None)
    assert whole.within_budget(huge[:5000]) == huge[:5000]
    with pytest.raises(ValueError, match="max_privileged_tokens: expected a positive int or None, got 0"):
        PromptBuilder("text", tokenizer_dir=path, max_privileged_tokens=0)
