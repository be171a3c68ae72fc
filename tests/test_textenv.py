"""Any text environment in the trainer and the evaluation (issue 23): the config checks (one test
per class of bad input, each one line naming the key), the text template (the Rust rendering
against Python's jinja2 on random inputs), the skills of a text env, the rollout loop on Python
envs (rewards, faults), and the example Gymnasium env trained end to end with its tiny preset and
evaluated with ``python -m pcsd.eval``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pcsd.text.prompts import TEXT_TEMPLATE, TEXT_TEMPLATE_VARIABLES, PromptBuilder, SkillRepository
from pcsd.train.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
GYM = ["preset=tiny-cpu-gym"]


def _cfg(*over: str, method: str = "grpo"):
    if any(o.startswith("env.entry_point=textenv_faults") for o in over):  # from the default preset
        return load_config(["env.name=gym", f"method={method}", *over])
    return load_config(GYM + [f"method={method}", *over])


# ----------------------------------------------------------------------------- config checks
@pytest.mark.parametrize(
    "over,key,what",
    [
        (
            ["env.entry_point=no_such_pkg_xyz.envs:Env"],
            "env.entry_point=no_such_pkg_xyz.envs:Env",
            "no module named 'no_such_pkg_xyz'",
        ),
        (
            ["env.entry_point=textenv_needs_pkg:Env"],
            "env.entry_point=textenv_needs_pkg:Env",
            "no module named 'no_such_package_abc' in the packages textenv_needs_pkg imports",
        ),
        (["env.entry_point=textenv_faults:Nope"], "env.entry_point=textenv_faults:Nope", "has no attribute 'Nope'"),
        (["env.entry_point=textenv_faults"], "env.entry_point=textenv_faults", "expected 'module:Class'"),
        (["env.entry_point=null"], "env.entry_point", "needs exactly one of env.entry_point"),
        (["env.id=KeyDoor-v0"], "env.entry_point", "not both"),
        (["env.entry_point=null", "env.id=NoSuchEnv-v7"], "env.id=NoSuchEnv-v7", "NoSuchEnv"),
        (["env.kwargs.colours=3"], "env.kwargs=", "unexpected keyword argument 'colours'"),
        (
            ["env.entry_point=textenv_faults:NeedsArg"],
            "env.entry_point=textenv_faults:NeedsArg",
            "missing 1 required positional argument",
        ),
        (["env.kwargs.colors=9"], "env.entry_point=examples.keydoor:KeyDoorEnv", "colors: expected 2..6"),
        (
            ["env.entry_point=textenv_faults:NonText", "env.kwargs={bad_seed: 0, at: 1}"],
            "env.entry_point",
            "observation of type int, expected str",
        ),
        (["env.entry_point=textenv_faults:OldGymStep"], "env.entry_point", "returned a tuple of 4"),
        (
            ["env.entry_point=textenv_faults:Raises", "env.kwargs={bad_seed: 0, at: 0}"],
            "env.entry_point",
            "reset() raised RuntimeError: boom",
        ),
        (
            ["env.entry_point=textenv_faults:Hangs", "env.kwargs={bad_seed: 0, at: 1}", "env.step_timeout=1"],
            "env.entry_point",
            "did not return within 1 s",
        ),
        (
            ["env.entry_point=textenv_faults:Exits", "env.kwargs={bad_seed: 0, at: 1}"],
            "env.entry_point",
            "worker process died (exit code 3)",
        ),
        (["env.eval_kwargs={colors: 1}"], "env.eval_kwargs=", "colors: expected 2..6"),
        (["env.rooms=[bedroom]"], "env.rooms", "ALFWorld / WebShop setting"),
        (["env.url=http://x"], "env.url", "not a setting of env.name=gym"),
        (["eval.protocol=paper"], "eval.protocol=paper", "use eval.protocol=full"),
        (["env.step_timeout=0"], "env.step_timeout", "must be > 0"),
        (["env.template=no/such.jinja"], "env.template=no/such.jinja", "no such file"),
    ],
)
def test_bad_environment_config_is_one_line_naming_the_key(gymnasium_available, over, key, what):
    with pytest.raises(ConfigError) as ei:
        _cfg(*over)
    msg = str(ei.value)
    assert key in msg and what in msg and "\n" not in msg, msg


def test_env_name_on_the_command_line_replaces_the_presets_environment(gymnasium_available):
    """``env.name=gym`` over the default preset (ALFWorld's procedural games): the preset's game
    knobs return to their defaults, its other settings stay."""
    cfg = load_config(["env.name=gym", "env.entry_point=examples.keydoor:KeyDoorEnv", "method=grpo"])
    assert cfg.env.rooms is None and cfg.env.receptacles is None and cfg.env.max_steps == 15
    assert cfg.optim.sft_steps == 800  # the preset's
    gym = load_config(GYM + ["method=grpo"])
    assert load_config(GYM + ["env.name=alfworld", "method=grpo"]).env.kwargs == {}
    assert gym.env.kwargs == {"colors": 3}


def test_methods_that_read_skills_need_a_skills_folder(gymnasium_available):
    with pytest.raises(ConfigError, match=r"env.skills_dir: method pcsd reads the teacher's skills.*method=grpo"):
        _cfg("env.skills_dir=null", method="pcsd")
    with pytest.raises(ConfigError, match="env.skills_dir: method skill-grpo"):
        _cfg("env.skills_dir=null", method="skill-grpo")
    assert _cfg("env.skills_dir=null", method="grpo").env.skills_dir is None
    assert _cfg(method="pcsd").env.name == "gym"


def test_python_env_keys_are_refused_for_the_native_envs():
    with pytest.raises(ConfigError, match="env.entry_point is a setting of the Python environments"):
        load_config(["env.entry_point=examples.keydoor:KeyDoorEnv"])
    with pytest.raises(ConfigError, match="env.kwargs is a setting of the Python environments"):
        load_config(["env.kwargs.colors=3"])


@pytest.mark.parametrize(
    "src,what",
    [("{% if task %}never closed", "compiling the environment's prompt template"), ("{{ taks }}", "undefined")],
)
def test_bad_template_names_env_template(gymnasium_available, tmp_path, src, what):
    t = tmp_path / "t.jinja"
    t.write_text(src)
    with pytest.raises(ConfigError) as ei:
        _cfg(f"env.template={t}")
    assert str(ei.value).startswith(f"env.template={t}: ") and what in str(ei.value)


def test_cli_bad_env_exits_2_with_one_line(gymnasium_available, child_env):
    r = subprocess.run(
        [sys.executable, "-m", "pcsd.train", "env.name=gym", "env.entry_point=nope_mod:Env", "method=grpo"],
        cwd=ROOT,
        env=child_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pcsd.train: env.entry_point=nope_mod:Env: no module named"), lines


# ----------------------------------------------------------------------------- the template
def _reference(src: str, task, obs, actions, history, step, h):
    """The template rendered by Python's jinja2 with the documented variables (the reference)."""
    env = jinja2.Environment(
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=False,
        autoescape=False,
    )
    shown = history[len(history) - min(h, len(history)) :] if h else []
    first = max(step + 1 - len(shown), 1)
    hist = [dict(step=first + j, observation=o, action=a) for j, (o, a) in enumerate(shown)]
    lines = "\n".join(
        f"[Observation {x['step']}: '{x['observation']}', Action {x['step']}: '{x['action']}']" for x in hist
    )
    instr = (
        "You should first reason step-by-step about the current situation. This reasoning process MUST be "
        "enclosed within <think> </think> tags.\nOnce you've finished your reasoning, you should choose "
        + ("an admissible action" if actions else "an action")
        + " for current step and present it within <action> </action> tags."
    )
    ctx = dict(
        task=task,
        observation=obs,
        actions=list(actions),
        history=hist,
        step=step,
        current_step=step + 1,
        admissible_actions="\n ".join(f"'{a}'" for a in actions),
        action_history=lines,
        instructions=instr,
        task_description=task,
        current_observation=obs,
        step_count=step,
        history_length=len(hist),
    )
    assert set(ctx) == set(TEXT_TEMPLATE_VARIABLES)
    return env.from_string(src).render(**ctx)


# \x1c-\x1f: whitespace to Python's str.strip, not to Rust's (minijinja's strip()); docs/environments.md says so
_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x1c\x1d\x1e\x1f"), max_size=30)
USER_TEMPLATE = (
    "{{ task | upper }} ({{ step }})\n{% for h in history %}\n{{ h.step }}. {{ h.observation }} -> "
    "{{ h.action }}\n{% endfor %}\n{% if actions %}choose: {{ actions | join(' | ') }}\n{% endif %}"
    "{{ observation.strip() }}\n"
)


@settings(max_examples=60, deadline=None)
@given(
    task=_text.filter(lambda t: t.strip()),
    obs=_text,
    actions=st.lists(_text, max_size=4),
    history=st.lists(st.tuples(_text, _text), max_size=4),
    extra=st.integers(0, 3),
    h=st.integers(0, 3),
    user=st.booleans(),
)
def test_text_prompts_equal_jinja2(task, obs, actions, history, extra, h, user):
    src = USER_TEMPLATE if user else TEXT_TEMPLATE
    step = len(history) + extra
    b = PromptBuilder("text", history_length=h, max_prompt_tokens=None, template=USER_TEMPLATE if user else None)
    assert b.build(task, obs, actions, history, step) == _reference(src, task, obs, actions, history, step, h)


def test_text_builder_defaults_and_refusals():
    b = PromptBuilder("text", max_prompt_tokens=None)
    assert b.template == TEXT_TEMPLATE
    assert PromptBuilder("alfworld").template is None
    with pytest.raises(ValueError, match="`template`"):
        PromptBuilder("alfworld", template="{{ task }}")
    assert b.build_teacher("t", "o", []) == b.build("t", "o", [])  # no skills folder: the student's prompt


def test_text_skills_by_task_type_and_keyword(tmp_path):
    (tmp_path / "keywords").mkdir()
    (tmp_path / "general.md").write_text("G")
    (tmp_path / "GuessTheNumber-v0.md").write_text("T")
    (tmp_path / "keywords" / "door.md").write_text("K")
    repo = SkillRepository(tmp_path, "text")
    assert repo.retrieve("open the door", "GuessTheNumber-v0") == "G\n\nT\n\nK"
    assert repo.retrieve("guess", "other") == "G"
    b = PromptBuilder("text", max_prompt_tokens=None, skills=repo)
    t = b.build_teacher("open the door", "o", [], task_type="GuessTheNumber-v0")
    assert t.endswith(b.build("open the door", "o", [])) and "T" in t.split("[End of Skill Information]")[0]
    with pytest.raises(ValueError, match="unexpected file"):
        (tmp_path / "bad name.md").write_text("x")
        SkillRepository(tmp_path, "text")


def test_text_format_reads_actions():
    from pcsd.text.formats import text_format

    fmt = text_format("text")
    ok = "<think>x</think><action>anything goes</action>"
    assert fmt.parse(ok, []).is_valid and fmt.parse(ok, []).action == "anything goes"
    assert not fmt.parse(ok, ["go"]).is_valid and fmt.parse("<think>x</think><action>go</action>", ["go"]).is_valid
    assert not fmt.parse("go", []).is_valid  # the format is still checked
    assert fmt.task("the task", "first page") == "the task" and fmt.view("p", ["a"], "t") == ("p", ["a"])


# ----------------------------------------------------------------------------- the rollout loop
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    from pcsd.rollout.backends import make_backend
    from pcsd.tiny_model import make_tiny_model

    path = make_tiny_model(tmp_path_factory.mktemp("tiny"), hidden_size=64, num_layers=2, seed=0)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    builder = PromptBuilder("text", history_length=1, max_prompt_tokens=1024, tokenizer_dir=path)
    eos = builder.tokenizer.encode("<|im_end|>")[0]
    return make_backend("hf", model=model, pad_token_id=eos), builder, eos


def _roll(tiny, factory, seeds, group=2, **kw):
    from pcsd.rollout.loop import collect_rollouts

    backend, builder, eos = tiny
    return collect_rollouts(
        backend,
        builder,
        seeds,
        group,
        max_steps=3,
        max_response_tokens=8,
        seed=1,
        stop_token_ids=[eos],
        env_kind="gym",
        env_options={"make_env": factory, **kw},
    )


def test_rollouts_on_a_python_env_reward_its_summed_reward(tiny):
    from pcsd.envs.protocol import EnvFactory

    rb = _roll(tiny, EnvFactory("textenv_faults:Counter", kwargs={"length": 2}), [5, 6])
    assert rb.num_trajectories == 4 and rb.traj_group.tolist() == [0, 0, 1, 1]
    assert rb.task == ["count 5", "count 5", "count 6", "count 6"]
    assert rb.task_type == ["count"] * 4
    assert rb.length.tolist() == [2] * 4 and rb.score.tolist() == [2.0] * 4  # reward 1 per step
    assert torch.equal(rb.reward, rb.score.float()) and rb.env_errors == 0


def test_rollout_rows_carry_the_envs_anchor_and_step_rewards(tiny):
    """GiGPO's inputs: each row's anchor is the env's info["anchor"] of the observation it answered
    (shared by a group's envs at each step), its step reward the env's reward of that step."""
    from pcsd.envs.protocol import EnvFactory

    rb = _roll(tiny, EnvFactory("textenv_faults:Anchored", kwargs={"length": 2}), [5, 6])
    for g in range(2):
        for k in range(2):
            rows = ((rb.group_id == g) & (rb.turn == k)).nonzero().flatten()
            assert rows.numel() == 2 and len(set(rb.anchor[rows].tolist())) == 1
    assert len(set(rb.anchor[rb.turn == 0].tolist())) == 1  # "0" in both groups: one id (groups apart in GiGPO)
    assert rb.anchor[rb.turn == 0][0] != rb.anchor[rb.turn == 1][0]
    go = torch.tensor([a == "go" for a in rb.actions], dtype=torch.float32)
    assert torch.equal(rb.step_reward, go)
    sums = torch.zeros(rb.num_trajectories).index_add(0, rb.traj_id, rb.step_reward)
    assert torch.equal(sums, rb.reward)


def test_a_faulty_env_ends_its_episode_and_the_rollout_goes_on(tiny):
    from pcsd.envs.protocol import EnvFactory

    rb = _roll(tiny, EnvFactory("textenv_faults:Exits", kwargs={"length": 3, "bad_seed": 13, "at": 2}), [12, 13])
    assert rb.env_errors == 2  # both envs of the seed-13 group
    assert rb.length.tolist() == [3, 3, 2, 2] and rb.score.tolist()[:2] == [3.0, 3.0]
    assert rb.score.tolist()[2:] == [0.0, 0.0] and not rb.won[2:].any()
    with pytest.raises(RuntimeError, match="every environment failed at reset"):
        _roll(tiny, EnvFactory("textenv_faults:Raises", kwargs={"bad_seed": 4, "at": 0}), [4])


# ----------------------------------------------------------------------------- end to end
def _train_example_env(run: Path, child_env: dict, extra: list[str]) -> dict:
    """``python -m pcsd.train preset=tiny-cpu-gym method=pcsd optim.steps=2`` (the teacher reading the
    example's skills) plus ``extra``; checks what every such run leaves and returns its summary."""
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pcsd.train",
            "preset=tiny-cpu-gym",
            "method=pcsd",
            f"run.dir={run}",
            "optim.steps=2",
            *extra,
        ],
        cwd=ROOT,
        env=child_env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    s = json.loads((run / "summary.json").read_text())
    assert s["steps"] == 2 and s["sft_expert_success"] == 100.0
    for key in ("success_before", "success_after", "mean_reward_before", "mean_reward_after"):
        assert s[key] is not None, key
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2], metrics
    assert "Mean reward" in (run / "eval.md").read_text()
    assert (run / "skills" / "general.md").is_file()
    return dict(summary=s, metrics=metrics)


def test_example_env_trains_end_to_end_and_evaluates(gymnasium_available, tmp_path, child_env):
    """The default run's end-to-end form (a short warm-up): the example env trains two RL steps with
    the teacher reading its skills, is evaluated before and after, then ``python -m pcsd.eval`` on the
    run replays fixed evaluation games. What the preset's whole warm-up learns is the slow test below."""
    run = tmp_path / "run"
    _train_example_env(run, child_env, ["optim.sft_steps=20", "optim.sft_games=40", "eval.episodes=8"])
    r = subprocess.run(
        [sys.executable, "-m", "pcsd.eval", "--model", str(run), "--backend", "hf", "--quiet", "--episodes", "8"],
        cwd=ROOT,
        env=child_env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "gym examples.keydoor:KeyDoorEnv" in r.stdout and "Mean reward" in r.stdout
    doc = json.loads((run / "eval" / "results.json").read_text())
    res = doc["results"][0]
    assert res["env"] == "gym" and res["episodes"] == 8 and res["mean_reward"] is not None
    assert [g["game"] for g in res["games"]] == [str(1_000_000_000 + i) for i in range(8)]


@pytest.mark.slow
def test_example_env_learns_from_the_presets_warm_up(gymnasium_available, tmp_path, child_env):
    """The preset's own warm-up (the env's expert, 600 steps): every sampled action is valid and the
    warm-up copies the door's colour (success far above the ~11 % of a model that picks a colour at
    random; it was 3 % with the preset's earlier warm-up, 0 % with the budget that cut every action)."""
    out = _train_example_env(tmp_path / "run", child_env, [])
    s = out["summary"]
    assert s["sft_examples"] == 2000
    assert s["success_before"] >= 30.0, s  # 32 episodes: chance play wins ~11 % (>= 10 of 32: p < 0.01)
    assert all(m["valid_actions"] >= 0.9 for m in out["metrics"]), out["metrics"]


_QUICK = [
    "preset=tiny-cpu-gym",
    "optim.sft_steps=0",
    "optim.steps=1",
    "rollout.tasks_per_step=1",
    "rollout.group_size=2",
    "rollout.max_response_tokens=8",
    "eval.episodes=2",
    "env.max_steps=2",
    "model.tiny_layers=1",
    "run.progress=false",
    "run.tensorboard=false",
]


def _train_quick(run: Path, method: str) -> dict:
    from pcsd.train.cli import main

    assert main([*_QUICK, f"method={method}", f"run.dir={run}"]) == 0
    return json.loads((run / "summary.json").read_text())


def test_generated_tiny_model_without_warm_up_trains_with_and_without_a_teacher(
    gymnasium_available, tmp_path, monkeypatch
):
    """``optim.sft_steps=0`` with the generated tiny model (its tokenizer learns the envs' first
    pages); RLSD (the teacher's gaps in the advantages) and Skill-GRPO (the skills in the student's
    prompts) on the example env."""
    monkeypatch.chdir(ROOT)  # the example env is imported from the current folder
    for method in ("rlsd", "skill-grpo"):
        s = _train_quick(tmp_path / method, method)
        assert s["steps"] == 1 and "sft_examples" not in s and s["success_after"] is not None, method
        assert (tmp_path / method / "base-model" / "tokenizer.json").is_file()


def test_a_gigpo_run_records_its_anchor_groups(gymnasium_available, tmp_path, monkeypatch):
    """``algo.estimator=gigpo`` on the example env: each step's metrics.jsonl line holds the batch's
    anchor groups (the two episodes of a group start from the same observation, so some rows share
    one); a GRPO run's lines hold none."""
    from pcsd.train.cli import main

    monkeypatch.chdir(ROOT)
    runs = {}
    for est in ("gigpo", "grpo"):
        runs[est] = tmp_path / est
        assert main([*_QUICK, "method=pcsd", f"algo.estimator={est}", f"run.dir={runs[est]}"]) == 0
    (rec,) = [json.loads(line) for line in (runs["gigpo"] / "metrics.jsonl").read_text().splitlines()]
    assert rec["anchor_groups"] >= 1 and rec["anchor_group_rows"] >= 1.0, rec
    assert 0.0 < rec["anchor_shared"] <= 1.0, rec
    (rec,) = [json.loads(line) for line in (runs["grpo"] / "metrics.jsonl").read_text().splitlines()]
    assert not any(k.startswith("anchor") for k in rec)


def test_no_expert_skips_the_warm_up_with_a_message(gymnasium_available, tmp_path, monkeypatch, capsys):
    from pcsd.train.cli import main

    monkeypatch.chdir(ROOT)
    quick = [o for o in _QUICK if not o.startswith("preset=")]  # the default preset, its env replaced
    assert (
        main(
            [
                *quick,
                "env.name=gym",
                "env.entry_point=textenv_faults:NoExpert",
                "env.kwargs={length: 2}",
                "method=grpo",
                "optim.sft_steps=5",
                "optim.sft_games=4",
                "optim.steps=0",
                f"run.dir={tmp_path / 'r'}",
            ]
        )
        == 0
    )
    assert "warm-up skipped: textenv_faults:NoExpert" in capsys.readouterr().out
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert s["sft_skipped"] == "no expert" and not (tmp_path / "r" / "sft-model").exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    "method", ["vanilla", "skill-prompt", "grpo", "opsd", "grpo+opsd", "sdar", "skill-sd", "pcsd-fixed-n4", "pcsd-star"]
)
def test_every_method_trains_on_a_python_env(gymnasium_available, tmp_path, monkeypatch, method):
    monkeypatch.chdir(ROOT)
    s = _train_quick(tmp_path / "r", method)
    assert s["method"] == method and s["success_after"] is not None


def test_the_docs_example_is_the_example_file_and_short():
    """docs/environments.md shows examples/keydoor.py whole (a file a user can copy), under 60 lines,
    and its built-in template is the one the native side renders."""
    doc = (ROOT / "docs" / "environments.md").read_text()
    src = (ROOT / "examples" / "keydoor.py").read_text()
    assert f"```python\n{src}```" in doc
    assert len(src.splitlines()) < 60
    assert f"```jinja\n{TEXT_TEMPLATE}```" in doc


def test_text_env_demonstrations_restate_the_task():
    """The warm-up's reasoning for a text env restates the task (the action then copies its words
    from a few tokens back); ALFWorld's and WebShop's stay as they were."""
    from pcsd.train.sft import think_for

    assert think_for("open the red door.", "take red key", restate_task=True) == "open the red door. Next: take."
    assert think_for("open the red door.", "take red key") == "Next: take."
    assert think_for("put a hot apple in fridge.", "go to fridge 1", restate_task=True) == (
        "apple to fridge. Next: go."
    )


# ----------------------------------------------------------------------------- TextArena and OpenEnv kinds
OPENENV_FIXTURES = HERE / "fixtures" / "openenv"
_SMALL = [
    "model.tiny_layers=1",
    "model.tiny_hidden_size=64",
    "rollout.backend=hf",
    "rollout.tasks_per_step=2",
    "rollout.group_size=2",
    "rollout.max_response_tokens=24",  # holds the warm-up's targets (a shorter budget is refused)
    "optim.steps=1",
    "eval.episodes=2",  # the evaluations before and after RL run; pcsd.eval below plays 4 episodes
    "env.history_length=1",
    "run.device=cpu",
    "run.progress=false",
    "run.tensorboard=false",
]


def _skills(root: Path, task_type: str, text: str) -> Path:
    (root / "general.md").parent.mkdir(parents=True, exist_ok=True)
    (root / "general.md").write_text("Read the task and the last observation; put one action in <action></action>.\n")
    (root / f"{task_type}.md").write_text(text)
    return root


def _train_and_eval(run: Path, over: list[str], capsys, label: str) -> tuple[dict, dict, str]:
    """``python -m pcsd.train ... method=pcsd`` then ``python -m pcsd.eval --model <run>``, each as its
    ``main`` in this process (the commands are ``sys.exit(main())``; the example env's test above runs
    both as processes of their own): the run's summary, the evaluation's result row and its printed
    table."""
    from pcsd.eval.cli import main as eval_main
    from pcsd.train.cli import main as train_main

    capsys.readouterr()
    code = train_main([*over, "method=pcsd", *_SMALL, f"run.dir={run}"])
    out, err = capsys.readouterr()
    assert code == 0, out[-3000:] + err[-3000:]
    s = json.loads((run / "summary.json").read_text())
    assert s["steps"] == 1 and s["method"] == "pcsd"
    for key in ("success_before", "success_after", "mean_reward_before", "mean_reward_after"):
        assert s[key] is not None, key
    code = eval_main(["--model", str(run), "--backend", "hf", "--quiet", "--episodes", "4"])
    out, err = capsys.readouterr()
    assert code == 0, out[-3000:] + err[-3000:]
    assert label in out and "Mean reward" in out, out
    res = json.loads((run / "eval" / "results.json").read_text())["results"][0]
    assert res["episodes"] == 4 and res["mean_reward"] is not None
    assert [g["game"] for g in res["games"]] == [str(1_000_000_000 + i) for i in range(4)]
    return s, res, out


def test_textarena_game_trains_end_to_end_and_evaluates(textarena_available, tmp_path, capsys):
    """``env.name=textarena env.id=GuessTheNumber-v0``: the warm-up on the adapter's expert (binary
    search on the game's hints: every episode won), one GRPO + PCSD step whose teacher reads the
    game's skills (task type = the game id), evaluations before and after, then ``pcsd.eval``."""
    skills = _skills(
        tmp_path / "skills",
        "GuessTheNumber-v0",
        "Guess the middle of the range the hints leave open, in square brackets: [10].\n",
    )
    s, res, out = _train_and_eval(
        tmp_path / "run",
        [
            "env.name=textarena",
            "env.id=GuessTheNumber-v0",
            f"env.skills_dir={skills}",
            "env.max_steps=6",
            "optim.sft_steps=2",  # the expert's 8 games make the examples; two small steps train on them
            "optim.sft_batch_size=2",
            "optim.sft_games=8",
        ],
        capsys,
        "textarena GuessTheNumber-v0",
    )
    assert s["sft_expert_success"] == 100.0 and s["sft_examples"] > 0
    assert res["env"] == "textarena"


def test_openenv_server_trains_end_to_end_and_evaluates(openenv_available, tmp_path, capsys):
    """``env.name=openenv env.url=...`` against a real OpenEnv server this test starts on 127.0.0.1
    (tests/fixtures/openenv/guess_server.py, openenv-core): no expert, so no warm-up (the generated
    model's tokenizer learns the envs' first pages), one GRPO + PCSD step, evaluations, ``pcsd.eval``."""
    from pcsd.envs.openenv import OpenEnvServer

    skills = tmp_path / "skills"
    skills.mkdir()
    (skills / "general.md").write_text("Guess the middle of the numbers the hints leave open.\n")
    with OpenEnvServer("guess_server:app", app_dir=str(OPENENV_FIXTURES)) as server:
        s, res, out = _train_and_eval(
            tmp_path / "run",
            [
                "env.name=openenv",
                f"env.url={server.base_url}",
                f"env.skills_dir={skills}",
                "env.max_steps=3",
                "optim.sft_steps=0",
            ],
            capsys,
            f"openenv {server.base_url}",
        )
    assert "sft_examples" not in s and res["env"] == "openenv"


def _kind_cfg(*over: str):
    return load_config(["method=grpo", *over])


def _refused(kind: str, over: list[str], key: str, what: str) -> None:
    """The config with ``over`` is refused at read with one line that starts with ``key``."""
    with pytest.raises(ConfigError) as ei:
        _kind_cfg(kind, *over)
    msg = str(ei.value)
    assert msg.startswith(key) and what in msg and "\n" not in msg, msg


def test_textarena_config_is_checked_at_read(textarena_available, monkeypatch):
    cfg = _kind_cfg("env.name=textarena", "env.id=GuessTheNumber-v0", "env.kwargs.max_number=50")
    assert cfg.env.id == "GuessTheNumber-v0" and cfg.env.kwargs == {"max_number": 50}
    for over, key, what in [
        (["env.id=GuessTheNumbr-v0"], "env.id=GuessTheNumbr-v0", "did you mean GuessTheNumber-v0"),
        (
            ["env.id=GuessTheNumber-v0", "env.kwargs.colours=3"],
            "env.kwargs={'colours': 3}",
            "unexpected keyword argument 'colours'",
        ),
        (["env.id=TicTacToe-v0"], "env.id=TicTacToe-v0", "single-player"),
        ([], "env.id", "needs env.id=<a TextArena game id>"),
        (["env.id=GuessTheNumber-v0", "env.entry_point=a:B"], "env.entry_point", "not a setting of env.name=textarena"),
    ]:
        _refused("env.name=textarena", over, key, what)
    monkeypatch.setitem(sys.modules, "textarena", None)  # as if the package were not installed
    with pytest.raises(ConfigError) as ei:
        _kind_cfg("env.name=textarena", "env.id=Sudoku-v0")
    assert str(ei.value) == (
        "env.name=textarena needs the 'textarena==0.7.4' package, which is not installed: pip install 'pcsd[textarena]'"
    )


def test_openenv_config_is_checked_at_read(openenv_available, monkeypatch):
    """``env.url`` (a running server) and ``env.kwargs.start`` (an app pcsd serves once per process,
    checked with a reset and a step when the config is read); each bad input one line naming the key."""
    from pcsd.envs import registry
    from pcsd.envs.openenv import OpenEnvServer

    start = ["env.kwargs.start=guess_server:app", f"env.kwargs.app_dir={OPENENV_FIXTURES}"]
    cfg = _kind_cfg("env.name=openenv", *start)
    (server,) = [v for k, v in registry._SERVED.items() if k[0] == "guess_server:app"]
    assert server.alive and cfg.env.kwargs.start == "guess_server:app"
    assert _kind_cfg("env.name=openenv", *start) is not None  # the same server
    assert [v for k, v in registry._SERVED.items() if k[0] == "guess_server:app"] == [server]
    url = server.base_url
    assert _kind_cfg("env.name=openenv", f"env.url={url}", "env.kwargs.message_timeout_s=5").env.url == url
    with OpenEnvServer("health_only:app", app_dir=str(OPENENV_FIXTURES)) as other:
        dead = other.base_url  # an address with nothing behind it once this server stops
    for over, key, what in [
        ([], "env.url", "needs env.url=<a running server's address"),
        ([f"env.url={url}", "env.kwargs.start=guess_server:app"], "env.url", "not both"),
        ([f"env.url={dead}"], f"env.url={dead}", "is unreachable"),
        (["env.url=127.0.0.1:80"], "env.url=127.0.0.1:80", "base_url must be an http(s)://"),
        ([f"env.url={url}/grid"], f"env.url={url}/grid", "its action MoveAction(x, y) has no text field"),
        (
            [f"env.url={url}", "env.kwargs.message_timeout=3"],
            "env.kwargs={'message_timeout': 3}",
            "unexpected keyword argument 'message_timeout'",
        ),
        ([f"env.url={url}", "env.kwargs.app_dir=."], "env.kwargs.app_dir", "settings of env.kwargs.start"),
        (["env.kwargs.start=no_such_server_mod:app"], "env.kwargs.start=no_such_server_mod:app", "no module"),
        (
            ["env.kwargs.start=textenv_faults:app", f"env.kwargs.app_dir={HERE}"],
            "env.kwargs.start=textenv_faults:app",
            "exited with code",
        ),
        ([f"env.url={url}", "env.id=x"], "env.id", "not a setting of env.name=openenv"),
    ]:
        _refused("env.name=openenv", over, key, what)
    monkeypatch.setitem(sys.modules, "websockets", None)  # as if the package were not installed
    with pytest.raises(ConfigError) as ei:
        _kind_cfg("env.name=openenv", f"env.url={url}")
    assert str(ei.value) == (
        "env.name=openenv needs the 'websockets' package, which is not installed: pip install 'pcsd[openenv]'"
    )
