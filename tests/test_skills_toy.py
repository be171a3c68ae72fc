"""A user-supplied skill repository (``env.skills_dir``), the generator's ``usual_place`` knob, the
expert that follows the skills and the ``tiny-cpu-skills`` preset (issue 15, part 3)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pcsd.envs.procedural import generate_game_json, usual_places, write_games
from pcsd.text import prompts as P
from pcsd.train.config import ConfigError, load_config, resolve_skills_dir

TASK = "put some keychain on sofa"
ADM = ["go to armchair 1", "go to dresser 1", "go to drawer 1", "inventory", "look"]


def _repo(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def test_repository_retrieval(tmp_path):
    repo = P.SkillRepository(
        _repo(
            tmp_path,
            {
                "general.md": "G\n",
                "pick_and_place_simple.md": "PP\n",
                "look_at_obj_in_light.md": "LOOK\n",
                "keywords/keychain.md": "K\n",
                "keywords/key.md": "NOT A WHOLE WORD\n",
            },
        )
    )
    assert repo.retrieve(TASK) == "G\n\nPP\n\nK"
    assert repo.retrieve("examine the book with the desklamp") == "G\n\nLOOK"
    assert repo.retrieve("Put some KeyChain on sofa") == "G\n\nPP\n\nK"  # case-insensitive words
    block = repo.block(TASK)
    assert block.startswith("[Privileged Skill Information]\nG") and block.endswith("[End of Skill Information]\n\n")


def test_repository_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        P.SkillRepository(tmp_path / "nope")
    with pytest.raises(ValueError, match="no skill file"):
        P.SkillRepository(_repo(tmp_path / "empty", {"notes.txt": "x"}))
    with pytest.raises(ValueError, match="unexpected file 'README.md'"):
        P.SkillRepository(_repo(tmp_path / "a", {"general.md": "G", "README.md": "x"}))
    with pytest.raises(ValueError, match="unexpected file 'keywords/Key-Chain.md'"):
        P.SkillRepository(_repo(tmp_path / "b", {"keywords/Key-Chain.md": "x"}))
    with pytest.raises(ValueError, match="unexpected file 'pick_and_place_simple.md'"):
        P.SkillRepository(_repo(tmp_path / "c", {"pick_and_place_simple.md": "x"}), env="webshop")


def test_builder_uses_the_repository(tmp_path):
    from pcsd.tiny_model import make_tiny_model

    folder = _repo(tmp_path / "skills", {"keywords/keychain.md": "Keychains are kept in dressers."})
    model = make_tiny_model(tmp_path / "m")
    pb = P.PromptBuilder("alfworld", tokenizer_dir=model, max_prompt_tokens=None, skills=folder)
    builtin = P.PromptBuilder("alfworld", tokenizer_dir=model, max_prompt_tokens=None)
    hist = [("obs 1", "go to drawer 1")]
    s = pb.build(TASK, "o", ADM, hist, 1)
    t = pb.build_teacher(TASK, "o", ADM, hist, 1)
    assert t == P.SkillRepository(folder).block(TASK) + s
    assert "dressers" in t and P.retrieve_skills(TASK) not in t
    assert builtin.build_teacher(TASK, "o", ADM, hist, 1) != t
    req = [dict(task=TASK, observation="o", admissible=ADM, history=hist, step=1)]
    ((text, ids),) = pb.build_batch(req, teacher=True)
    assert text == t and ids == pb.encode_chat([t])[0] == pb.encode_batch(req, teacher=True)[0]
    assert pb.encode_batch(req) == builtin.encode_batch(req)  # the student's prompt is unchanged


def test_config_keys(tmp_path):
    with pytest.raises(ConfigError, match="env.skills_dir=.*does not exist"):
        load_config([f"env.skills_dir={tmp_path / 'missing'}"])
    _repo(tmp_path, {"README.md": "x"})
    with pytest.raises(ConfigError, match="env.skills_dir=.*unexpected file 'README.md'"):
        load_config([f"env.skills_dir={tmp_path}"])
    with pytest.raises(ConfigError, match="env.usual_place"):
        load_config(["env.usual_place=1.5"])
    with pytest.raises(ConfigError, match="optim.sft_teacher_share > 0"):
        load_config(["optim.sft_teacher_demos=skills"])
    with pytest.raises(ConfigError, match="optim.sft_teacher_demos"):
        load_config(["optim.sft_teacher_demos=other"])
    default = load_config([])
    assert default.env.skills_dir is None and default.env.usual_place == 0 and default.eval.before is True
    assert default.optim.sft_teacher_demos == "same" and default.optim.sft_teacher_share == 0


def test_usual_place_knob(tmp_path):
    kw = dict(room="bedroom", receptacles=6, distractors=0)
    for tt in ("pick_and_place_simple", "look_at_obj_in_light"):
        assert generate_game_json(tt, 7, **kw) == generate_game_json(tt, 7, usual_place=0.0, **kw)
    with pytest.raises(ValueError, match="usual_place=1.5"):
        generate_game_json("pick_and_place_simple", 1, usual_place=1.5)
    with pytest.raises(TypeError, match="usual_place"):
        generate_game_json("pick_and_place_simple", 1, usual_place="high")  # type: ignore[arg-type]
    # with usual_place=1 the skill-reading expert finds the object sooner than the blind one
    from pcsd.train.sft import expert_episodes, skill_search_first

    games = write_games(
        tmp_path / "g",
        40,
        100,
        ("pick_and_place_simple",),
        ("bedroom", "livingroom"),
        receptacles=6,
        distractors=0,
        usual_place=1.0,
    )
    repo = P.SkillRepository(resolve_skills_dir("skills/usual-places"))
    blind = expert_episodes(games, 15)
    reader = expert_episodes(games, 15, "plan", skill_search_first(repo))
    assert all(e.won for e in blind + reader)
    assert sum(len(e.steps) for e in reader) < sum(len(e.steps) for e in blind)
    # without a hint the expert is the blind one, move for move
    assert [e.steps for e in expert_episodes(games[:5], 15, "plan", lambda task: ())] == [e.steps for e in blind[:5]]


def test_preset_skills_match_the_generator():
    cfg = load_config(["preset=tiny-cpu-skills"])
    assert cfg.env.usual_place > 0 and cfg.optim.sft_teacher_demos == "skills" and cfg.optim.sft_teacher_share > 0
    repo = P.SkillRepository(resolve_skills_dir(cfg.env.skills_dir))
    places = usual_places()
    assert sorted(repo.keywords) == sorted(o.lower() for o in places)
    for obj, rec in places.items():
        words = re.findall(r"[a-z]+", repo.keywords[obj.lower()])
        assert obj.lower() in words and rec.lower() in words, (obj, rec)
    # the default preset is untouched
    default = load_config([])
    assert default.env.skills_dir is None and default.env.usual_place == 0 and default.env.max_steps == 15


def test_sft_examples_with_teacher_episodes(tmp_path):
    from pcsd.models import eos_id
    from pcsd.tiny_model import make_tiny_model
    from pcsd.train.sft import expert_episodes, sft_examples, skill_search_first

    games = write_games(
        tmp_path / "g", 4, 5, ("pick_and_place_simple",), ("bedroom",), receptacles=6, distractors=0, usual_place=1.0
    )
    repo = P.SkillRepository(resolve_skills_dir("skills/usual-places"))
    pb = P.PromptBuilder("alfworld", tokenizer_dir=make_tiny_model(tmp_path / "m"), max_prompt_tokens=None, skills=repo)
    blind, reader = expert_episodes(games, 15), expert_episodes(games, 15, "plan", skill_search_first(repo))
    n_student = sum(len(e.steps) for e in blind)
    assert len(sft_examples(pb, blind, eos_id(pb), 0.0, teacher_episodes=reader)) == n_student
    both = sft_examples(pb, blind, eos_id(pb), 1.0, teacher_episodes=reader)
    assert len(both) == n_student + sum(len(e.steps) for e in reader)
    with_skills = [ids for ids, _ in both if "Privileged Skill Information" in pb.tokenizer.decode(ids)]
    assert len(with_skills) == sum(len(e.steps) for e in reader)


def test_smoke_of_the_toy_preset_without_the_evaluation_before(tmp_path):
    """tiny-cpu-skills' own path, shortened: the skills folder in the tokenizer's corpus, the
    skill-following expert plays, and eval.before=false skips the
    evaluation before RL (no success_before, one evaluation in evals.jsonl)."""
    from pcsd.train.cli import main

    run = tmp_path / "run"
    assert (
        main(
            [
                f"run.dir={run}",
                "preset=tiny-cpu-skills",
                "rollout.backend=hf",
                "optim.sft_steps=3",
                "optim.sft_games=6",
                "optim.sft_batch_size=2",
                "optim.steps=1",
                "rollout.tasks_per_step=1",
                "rollout.group_size=2",
                "rollout.max_response_tokens=40",  # holds the warm-up's targets (a shorter budget is refused)
                "env.max_steps=2",
                "eval.episodes=2",
                "eval.before=false",
                "run.tensorboard=false",
            ]
        )
        == 0
    )
    s = json.loads((run / "summary.json").read_text())
    assert s["preset"] == "tiny-cpu-skills" and "success_before" not in s and s["success_after"] is not None
    assert s["sft_skill_expert_success"] >= 0
    evals = [json.loads(x)["name"] for x in (run / "evals.jsonl").read_text().splitlines() if x.strip()]
    assert evals == ["after"]
    # the tokenizer's corpus holds every file of the skills folder (not the built-in skills)
    from pcsd.train.sft import game_corpus

    repo = P.SkillRepository(resolve_skills_dir("skills/usual-places"))
    corpus = game_corpus([], repo)
    assert set(repo.keywords.values()) <= set(corpus) and P.retrieve_skills("put some keychain on sofa") not in corpus
    # the run keeps a copy of what its teacher read, and pcsd.eval --skills on the run reads that copy
    own = P.SkillRepository(run / "skills")
    assert (own.general, own.task_types, own.keywords) == (repo.general, repo.task_types, repo.keywords)
    from pcsd.eval.cli import main as eval_main

    assert (
        eval_main(
            [
                "--model",
                str(run),
                "--skills",
                "--split",
                "procedural",
                "--procedural-games",
                "2",
                "--backend",
                "hf",
                "--device",
                "cpu",
                "--max-steps",
                "1",
                "--max-response-tokens",
                "4",
                "--quiet",
                "--out",
                str(tmp_path / "ev"),
            ]
        )
        == 0
    )
    (res,) = json.loads((tmp_path / "ev" / "results.json").read_text())["results"]
    assert res["settings"]["skills"] and res["settings"]["skills_dir"] == str(run / "skills")
    assert res["label"].endswith("*")


def test_saved_repository_retrieves_the_same(tmp_path):
    repo = P.SkillRepository(
        _repo(
            tmp_path / "a",
            {"general.md": "G\n", "pick_heat_then_place_in_recep.md": "  HEAT\n\n", "keywords/apple.md": "A\nB\n"},
        )
    )
    copy = P.SkillRepository(repo.save(tmp_path / "b"))
    for task in ("heat some apple and put it in fridge", "put a pen on desk"):
        assert copy.block(task) == repo.block(task)
    with pytest.raises(FileExistsError, match="exists already"):
        repo.save(tmp_path / "b")


def test_eval_skills_folder_choice_and_errors(tmp_path, capsys):
    """pcsd.eval: --skills-dir for every environment; a run's own copy for its environment; a run
    that trained with a skills folder but holds no copy is an error naming the way out; a bad
    --skills-dir fails before any model loads."""
    import argparse

    from pcsd.eval.cli import EvalError, _skill_repositories
    from pcsd.eval.cli import main as eval_main

    folder = _repo(tmp_path / "s", {"general.md": "G", "keywords/mug.md": "M"})
    args = argparse.Namespace(skills=True, skills_dir=str(folder))
    repos = _skill_repositories(args, None, {}, ["alfworld", "webshop"])
    assert all(r.folder == folder for r in repos.values())
    run = tmp_path / "run"
    (run / "skills").mkdir(parents=True)
    (run / "skills" / "general.md").write_text("RUN")
    cfg = {"env": {"name": "alfworld", "skills_dir": "anywhere"}}
    plain = argparse.Namespace(skills=True, skills_dir=None)
    repos = _skill_repositories(plain, run, cfg, ["alfworld", "webshop"])
    assert repos["alfworld"].general == "RUN" and repos["webshop"] is None
    assert _skill_repositories(argparse.Namespace(skills=False, skills_dir=None), run, cfg, ["alfworld"]) == {
        "alfworld": None
    }
    assert _skill_repositories(plain, run, {"env": {}}, ["alfworld"]) == {"alfworld": None}  # built-in skills
    (run / "skills" / "general.md").unlink()
    (run / "skills").rmdir()
    with pytest.raises(EvalError, match="holds no copy of it.*--skills-dir"):
        _skill_repositories(plain, run, cfg, ["alfworld"])
    assert (
        eval_main(
            [
                "--model",
                str(tmp_path / "no-model"),
                "--skills-dir",
                str(tmp_path / "nope"),
                "--split",
                "procedural",
                "--quiet",
            ]
        )
        == 2
    )
    assert "skills_dir=" in capsys.readouterr().err
    (tmp_path / "s" / "pick_heat_then_place_in_recep.md").write_text("H")  # a task-type file: ALFWorld only
    with pytest.raises(EvalError, match="skills_dir=.*unexpected file 'pick_heat_then_place_in_recep.md'"):
        _skill_repositories(args, None, {}, ["webshop"])
