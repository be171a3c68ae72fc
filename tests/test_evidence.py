"""The evidence toy and its experiment settings (issue 38, docs/evidence.md): the env's type-level
rules, its skills, the expert told whether the teacher's text is in the prompt, the noise knobs (the
env's wrong rules and the gaps' token-level noise, read by every rule through one place) and their
refusals; the short end-to-end form (the teacher's advantage after the warm-up, one distillation
update raising the student's log-prob of the teacher-favoured rule tokens)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from pcsd.envs.evidence import CODE_LENGTH, DECOY, RuleLockEnv, rules, skill_text
from pcsd.envs.protocol import read_reset, read_step
from pcsd.train.config import PRESET_DIR, ConfigError, load_config
from pcsd.train.update import experiment_teacher, gap_noise

SKILLS = PRESET_DIR / "skills" / "evidence"
ROOT = Path(__file__).resolve().parent.parent


def test_the_rules_hold_across_episodes_and_the_skills_state_them():
    r = rules(0)
    assert len(r) == 6 and all(len(c) == CODE_LENGTH for c in r.values())
    assert rules(0) == r and rules(1) != r  # fixed by rule_seed
    assert len(set(r.values())) == len(r)  # every type its own code
    for t, code in r.items():  # the shipped skills are the rules of rule_seed 0, as the action spells them
        assert (SKILLS / f"{t}.md").read_text().strip() == skill_text(t, code)
        assert f"dial {' '.join(code)} " in skill_text(t, code)
    env = RuleLockEnv()
    seen = {}
    for seed in range(40):
        obs, info = env.reset(seed=seed)
        o = read_reset((obs, info))
        assert o.task_type == env.item and o.anchor and env.item.replace("-", " ") in o.obs
        assert env.item.split("-")[0] not in o.task  # the item is in the observation only
        seen.setdefault(env.item, set()).add(env.code)
    assert all(len(codes) == 1 for codes in seen.values())  # a type's code is the same in every episode


def test_a_wrong_code_keeps_the_state_and_the_right_one_wins():
    env = RuleLockEnv()
    obs, info = env.reset(seed=3)
    wrong = next(c for c in env.codes if c != env.code)
    o = read_step(env.step(f"dial {wrong}"))
    assert not o.terminated and o.reward == 0.0 and o.anchor == info["anchor"]  # a repeated state (GiGPO)
    o = read_step(env.step("open sesame"))
    assert not o.terminated and o.anchor == info["anchor"]
    o = read_step(env.step(f"dial {env.code}"))
    assert o.terminated and o.won and o.reward == 1.0


def test_the_expert_is_told_whether_the_teacher_text_is_in_the_prompt():
    informed, blind = 0, 0
    for seed in range(200):
        env = RuleLockEnv()
        env.reset(seed=seed)
        assert env.expert_action(privileged=True) == f"dial {env.code}"
        env.reset(seed=seed)
        a = env.expert_action(privileged=False)
        informed += 1
        blind += a == f"dial {env.code}"
    assert 0.05 < blind / informed < 0.25  # a blind guess: 1 in 8
    env = RuleLockEnv()
    env.reset(seed=0)
    tried = set()
    for _ in range(8):  # the blind expert never repeats a code it tried
        a = env.expert_action(privileged=False)
        assert a not in tried
        tried.add(a)
        env.step(a)


def test_the_pool_passes_the_flag_to_the_expert():
    from pcsd.envs.protocol import EnvFactory
    from pcsd.envs.pypool import PythonEnvPool, check_env, play_experts
    from pcsd.envs.pyworker import expert_takes_privileged

    factory = EnvFactory("pcsd.envs.evidence:RuleLockEnv")
    assert check_env(factory).expert_takes_privileged
    assert not expert_takes_privileged(lambda: "x") and expert_takes_privileged(lambda **kw: "x")
    with PythonEnvPool(factory, 16, seeds=list(range(16)), max_steps=3) as pool:
        teacher = play_experts(pool, privileged=True)
    with PythonEnvPool(factory, 16, seeds=list(range(16)), max_steps=3) as pool:
        student = play_experts(pool, privileged=False)
    assert all(ep.won and len(ep.steps) == 1 for ep in teacher)
    assert sum(ep.won for ep in student) < 16


def test_rule_noise_reports_a_wrong_rule_or_a_decoy():
    env = RuleLockEnv(rule_noise=1.0)
    kinds = set()
    for seed in range(60):
        _, info = env.reset(seed=seed)
        assert info["task_type"] != env.item
        kinds.add("decoy" if info["task_type"] == DECOY else "wrong")
    assert kinds == {"decoy", "wrong"} and (SKILLS / f"{DECOY}.md").is_file()
    with pytest.raises(ValueError, match="rule_noise"):
        RuleLockEnv(rule_noise=1.5)


def test_the_preset_reads_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_config(["preset=tiny-cpu-evidence", "method=pcsd"])
    assert cfg.optim.sft_teacher_demos == "skills" and cfg.experiment.gap_noise == 0.0
    load_config(["preset=tiny-cpu-evidence", "method=skill-prompt"])  # the teacher by itself


def test_an_expert_without_the_flag_is_refused_for_split_demonstrations(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent))
    with pytest.raises(ConfigError, match=r"optim.sft_teacher_demos=skills: .*takes no privileged argument"):
        load_config(
            [
                "env.name=gym",
                "env.entry_point=textenv_secret:SecretDoor",
                "method=pcsd",
                "optim.sft_steps=2",
                "optim.sft_teacher_share=0.5",
                "optim.sft_teacher_demos=skills",
            ]
        )


@pytest.mark.parametrize(
    "override, message",
    [
        ("experiment.gap_noise=-1", "experiment.gap_noise must be >= 0"),
        ("experiment.gap_noise_rho=1.0", "experiment.gap_noise_rho must be in (-1, 1)"),
    ],
)
def test_bad_experiment_settings_are_one_line(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(["preset=tiny-cpu-evidence", override])
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_preset_may_not_set_experiment_keys(monkeypatch, tmp_path):
    import pcsd.train.config as config

    (tmp_path / "mine.yaml").write_text("preset: mine\nexperiment: {gap_noise: 0.5}\n")
    monkeypatch.setattr(config, "PRESET_DIR", tmp_path)
    monkeypatch.setattr(config, "available_presets", lambda: ["mine"])
    with pytest.raises(ConfigError, match=r"preset mine: experiment.\* are experiment settings") as e:
        load_config(["preset=mine"])
    assert "\n" not in str(e.value)


def test_gap_noise_iid_and_ar1_against_a_plain_loop():
    offsets = [0, 5, 9, 20]
    iid = gap_noise(offsets, 2.0, 0.0, seed=7)
    gen = torch.Generator().manual_seed(7)
    z = torch.randn(20, generator=gen, dtype=torch.float64)
    assert torch.allclose(iid, (2.0 * z).float())
    rho = 0.8
    ar = gap_noise(offsets, 2.0, rho, seed=7)
    ref = []
    for lo, hi in zip(offsets[:-1], offsets[1:]):  # the recurrence, restarted at every response
        e = z[lo].item()
        ref.append(e)
        for t in range(lo + 1, hi):
            e = rho * e + math.sqrt(1 - rho * rho) * z[t].item()
            ref.append(e)
    assert torch.allclose(ar, 2.0 * torch.tensor(ref, dtype=torch.float32), atol=1e-5)
    big = gap_noise([0, 200_000], 1.0, 0.9, seed=1)  # stationary: variance sigma^2, lag-1 correlation rho
    assert abs(big.var().item() - 1.0) < 0.05
    assert abs(torch.corrcoef(torch.stack([big[1:], big[:-1]]))[0, 1].item() - 0.9) < 0.02


def test_experiment_teacher_noises_and_negates_the_gap():
    teacher = torch.tensor([-0.1, -2.0, -0.5])
    old = torch.tensor([-1.0, -1.0, -1.0])
    idx = torch.tensor([2, 0, 1])
    noise = torch.tensor([10.0, 20.0, 30.0])
    assert torch.equal(experiment_teacher(teacher, old, None, idx, False), teacher)
    assert torch.allclose(experiment_teacher(teacher, old, noise, idx, False) - old, teacher - old + noise[idx])
    assert torch.allclose(experiment_teacher(teacher, old, None, idx, True) - old, -(teacher - old))


def test_every_rule_reads_the_noised_gap_through_one_place(monkeypatch):
    """The update's terms (pcsd.train.update.Terms.micro) hand every rule the same noised / negated
    gap and teacher log-probs: the rules see ``gap == teacher - old`` with the experiment applied."""
    from omegaconf import OmegaConf

    import pcsd.train.update as upd
    from pcsd.ops.weighting import get_rule

    seen = []

    class Spy:
        name = "spy"
        needs_old = False  # not a batch rule (pcsd.ops.weighting.WeightRule.needs_old)

        def terms(self, t, step, **p):
            seen.append(t)
            return get_rule("sdar").terms(t, step, **p)

        def params_from(self, section):
            return get_rule("sdar").params_from(section)

    T = 6
    layout = type(
        "L",
        (),
        dict(T=T, dev=torch.device("cpu"), offsets=[0, 3, 6], segments=lambda self, rows: (0, 3, 6)),
    )()
    teacher = torch.tensor([-0.1, -0.2, -0.3, -0.4, -0.5, -0.6])
    old = torch.full((T,), -1.0)
    sc = type("S", (), dict(teacher=teacher, old=old, ref=None))()
    monkeypatch.setattr(upd, "estimate_advantages", lambda rb, cfg, traj: torch.zeros(T))
    monkeypatch.setattr(upd, "token_coefficients", lambda mask, traj, n, agg: torch.ones(T))
    rb = type(
        "RB",
        (),
        dict(num_trajectories=2, teacher_context=None, token_traj_ids=lambda self: torch.tensor([0, 0, 0, 1, 1, 1])),
    )()
    for noise, negate in ((0.0, False), (1.5, False), (0.0, True), (1.5, True)):
        cfg = OmegaConf.create(
            dict(
                run=dict(seed=3),
                algo=dict(pcsd=dict(beta_gate=5.0), loss_agg="token-mean"),
                experiment=dict(gap_noise=noise, gap_noise_rho=0.5, negate_gap=negate),
            )
        )
        terms = upd.Terms(rb, cfg, layout, sc, Spy(), 0, upd.single_process())
        seen.clear()
        terms.micro([0, 1], torch.arange(T), old)
        t = seen[0]
        expected = teacher - old
        if noise:
            expected = expected + gap_noise([0, 3, 6], noise, 0.5, seed=3 * 1_000_003 + 1 * 7919)
        if negate:
            expected = -expected
        assert torch.allclose(t.gap, expected, atol=1e-6), (noise, negate)
        assert torch.allclose(t.teacher_logp - t.old_logp, t.gap, atol=1e-6)


# ----------------------------------------------------------------------------- the short end-to-end form
def _compare_methods():
    import importlib.util

    spec = importlib.util.spec_from_file_location("compare_methods", ROOT / "benchmarks" / "compare_methods.py")
    cm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cm)
    return cm


def test_the_toy_short_form_teacher_advantage_and_one_distillation_update(tmp_path):
    """The one end-to-end run of this capability in the default run (CI's short form of
    docs/evidence.md): a short warm-up of ``preset=tiny-cpu-evidence`` (``method=vanilla``) whose
    experts show the toy's teacher advantage (the expert that reads the rule wins every warm-up game,
    the blind one about a third), then one SGD step on PCSD's distillation loss alone raises the
    warm-up model's log-prob of the teacher-favoured rule tokens (benchmarks/compare_methods.py's
    trace, issue 38 item 5). No claim about RL's success."""
    import json

    from pcsd.train.cli import main

    warm = tmp_path / "warm"
    small = ["preset=tiny-cpu-evidence", "optim.sft_steps=40", "optim.sft_games=60", "eval.episodes=16"]
    assert main([*small, "method=vanilla", f"run.dir={warm}", "run.tensorboard=false", "eval.before=false"]) == 0
    s = json.loads((warm / "summary.json").read_text())
    assert s["sft_teacher_expert_success"] == 100.0 and s["sft_student_expert_success"] < 60.0, s
    tr = _compare_methods().trace_distillation(warm, "pcsd", games=12, lr=1.0, optimizer="sgd")
    assert tr["favoured_tokens"] > 0 and tr["grad_rule_tokens"] < 0, tr  # descent raises their log-probs
    assert tr["student_logp_favoured_after"] > tr["student_logp_favoured_before"], tr
    # P5's diagnostic runs on a Python env's run: its expert (told it reads the rule), the run's template
    from pcsd.diagnostics.cli import main as diagnostics

    out = tmp_path / "diag"
    assert diagnostics(["quality-alignment", "--run-dir", str(warm), "--games", "6", "--quiet", "--out", str(out)]) == 0
    qa = json.loads((out / "diagnostics.json").read_text())["quality_alignment"]
    assert "privileged=True" in qa["episodes_source"], qa["episodes_source"]


@pytest.mark.slow
def test_the_toy_teacher_wins_after_the_presets_warm_up(tmp_path):
    """The preset's whole warm-up (1500 steps), then ``method=skill-prompt`` on the same 200 games:
    the teacher (the rule in its prompt) wins at least 40 points more often than the student
    (docs/evidence.md measured 100 % vs 43 %, +57 points; issue 38's bar is 40)."""
    import json

    from pcsd.train.cli import main

    warm, teacher = tmp_path / "warm", tmp_path / "teacher"
    assert main(["preset=tiny-cpu-evidence", "method=vanilla", f"run.dir={warm}", "eval.before=false"]) == 0
    model = warm / "sft-model"
    args = ["preset=tiny-cpu-evidence", "method=skill-prompt", f"run.dir={teacher}", f"model.path={model}"]
    assert main([*args, "optim.sft_steps=0", "eval.before=false"]) == 0
    student_s = json.loads((warm / "summary.json").read_text())["success_after"]
    teacher_s = json.loads((teacher / "summary.json").read_text())["success_after"]
    assert teacher_s - student_s >= 40.0, (teacher_s, student_s)


def test_a_text_envs_teacher_warm_up_examples_carry_its_task_types_skills(tmp_path):
    """The warm-up's teacher-prompt examples retrieve a text env's task-type skills by the episode's
    type (they showed none before: the requests carried no task_type, so the teacher never saw a rule)."""
    from pcsd.envs.experts import ExpertEpisode
    from pcsd.models import eos_id
    from pcsd.text.prompts import PromptBuilder, SkillRepository
    from pcsd.tiny_model import make_tiny_model
    from pcsd.train.sft import sft_examples

    pb = PromptBuilder(
        "text",
        tokenizer_dir=make_tiny_model(tmp_path / "m"),
        max_prompt_tokens=None,
        skills=SkillRepository(SKILLS, "text"),
    )
    ep = ExpertEpisode(task="open the lock", task_type="red-cube", steps=[("A red cube.", [], "dial up left in")])
    for kw in (dict(teacher_episodes=[ep]), {}):
        texts = [pb.tokenizer.decode(ids) for ids, _ in sft_examples(pb, [ep], eos_id(pb), 1.0, **kw)]
        assert sum(skill_text("red-cube", rules(0)["red-cube"]) in t for t in texts) == 1, texts
