"""The trainer: one update moves every parameter, gradients against a plain reference, config and
method errors, a smoke run of ``python -m pcsd.train`` and the bit-exact resume."""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_run

from pcsd.train.config import ConfigError, load_config, resume_config
from pcsd.train.methods import METHODS, available_methods


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    from pcsd.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "m", hidden_size=64, num_layers=2, seed=3)


def _models(tiny_dir, perturb_frozen: float = 0.0):
    from pcsd.tiny_model import student_and_frozen

    return student_and_frozen(tiny_dir, perturb_frozen)


# ----------------------------------------------------------------------------- one update
def test_every_trained_parameter_changes(tiny_dir):
    from pcsd.tiny_model import synthetic_rollout_batch
    from pcsd.train.update import update_step

    cfg = load_config(
        [
            "rollout.backend=hf",
            "optim.lr=1e-3",
            "optim.tokens_per_microbatch=128",
            "rollout.max_prompt_tokens=96",
            "rollout.max_response_tokens=32",
        ]
    )
    student, frozen = _models(tiny_dir)
    before = {n: p.detach().clone() for n, p in student.named_parameters()}
    opt = torch.optim.AdamW(student.parameters(), lr=cfg.optim.lr)
    stats = update_step(student, frozen, opt, synthetic_rollout_batch(num_groups=3, group_size=2, seed=2), cfg, step=0)
    unchanged = [n for n, p in student.named_parameters() if torch.equal(p.detach(), before[n])]
    assert not unchanged, unchanged
    assert stats["pcsd"] != 0.0 and stats["tokens"] > 0


@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["algo.loss_agg=token-mean", "rule=sdar"],
        ["rule=rlsd"],
        ["optim.ppo_epochs=2"],
        ["method=skill-sd", "algo.lambda_distill=0.5"],
        ["method=skill-sd", "algo.lambda_distill=0.5", "optim.ppo_epochs=2"],
        ["method=opsd"],
        ["method=opsd", "optim.fused_lm_head=false"],
        ["method=sdpo", "algo.lambda_distill=0.5"],
        ["method=agentopsd"],
    ],
    ids=[
        "pcsd",
        "sdar-token-mean",
        "rlsd",
        "pcsd-old-pass",
        "skill-sd",
        "skill-sd-old-pass",
        "opsd",
        "opsd-unfused",
        "sdpo",
        "agentopsd",
    ],
)
def test_total_loss_gradients_match_plain_autograd(tiny_dir, extra):
    """update_step's accumulated micro-batch gradients == autograd of L_GRPO + lambda L_PCSD computed
    plainly (unpacked full-logit log-probs, pcsd.ops.grpo.grpo_loss, pcsd.ops.losses.pcsd_loss). One PPO
    epoch takes log pi_old from the update's own forward; two epochs score it in a separate pass
    (with lr 0 the second epoch's gradient is the first's)."""
    from plain_update import plain_update_loss

    from pcsd.ops.grpo import group_advantages
    from pcsd.tiny_model import plain_logprobs, synthetic_rollout_batch
    from pcsd.train.update import update_step

    cfg = load_config(
        [
            "rollout.backend=hf",
            "optim.tokens_per_microbatch=60",
            "rollout.max_prompt_tokens=40",
            "rollout.max_response_tokens=20",
            "optim.grad_clip=1e9",
            "algo.lambda_distill=0.5",
            "algo.kl_beta=0.1",
        ]
        + extra
    )
    student, frozen = _models(tiny_dir, perturb_frozen=0.02)
    rb = synthetic_rollout_batch(num_groups=2, group_size=3, seed=5, turns=(1, 2))  # both groups mixed
    opt = torch.optim.SGD(student.parameters(), lr=0.0)  # leaves the gradients in .grad
    update_step(student, frozen, opt, rb, cfg, step=3)
    got = {n: p.grad.clone() for n, p in student.named_parameters()}

    ref_model = copy.deepcopy(student)
    ref_model.zero_grad(set_to_none=True)
    with torch.no_grad():
        old = plain_logprobs(ref_model, rb.prompt_ids, rb.response_ids)
        ref = plain_logprobs(frozen, rb.prompt_ids, rb.response_ids)
        teacher = plain_logprobs(frozen, rb.teacher_prompt_ids, rb.response_ids)
    lp = plain_logprobs(ref_model, rb.prompt_ids, rb.response_ids)
    adv = group_advantages(rb.reward, rb.traj_group)
    assert float(adv.abs().min()) > 0.5  # every token carries a policy-gradient term
    total = plain_update_loss(cfg, rb, lp, old, ref, teacher, step=3)
    total.backward()
    for n, p in ref_model.named_parameters():
        torch.testing.assert_close(got[n], p.grad, rtol=2e-4, atol=2e-7, msg=n)
    assert any(float(g.abs().max()) > 1e-4 for g in got.values())


def test_a_new_rule_is_a_registration(tiny_dir):
    """A rule written as the one method (kind ``terms``) and registered by name trains with
    ``rule=NAME``: the update uses the advantages it gives (all 1: the policy term at ratio 1 is
    -sum(c) = -1) and scores no teacher for a rule that needs none."""
    from pcsd.ops import weighting
    from pcsd.ops.weighting import RuleTerms, register_rule
    from pcsd.tiny_model import synthetic_rollout_batch
    from pcsd.train.update import update_step

    @register_rule("test-ones", "terms", needs_teacher=False)
    def _ones(t, step):
        return RuleTerms(torch.ones_like(t.advantages))

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the rule and its keys are read: no key-has-no-effect warning
            cfg = load_config(
                ["rollout.backend=hf", "optim.tokens_per_microbatch=60", "rollout.max_prompt_tokens=40"]
                + ["rollout.max_response_tokens=20", "rule=test-ones"]
            )
        student, frozen = _models(tiny_dir, perturb_frozen=0.02)
        rb = synthetic_rollout_batch(num_groups=2, group_size=2, seed=5, turns=(1, 2))
        scored = []
        stats = update_step(
            student,
            frozen,
            torch.optim.SGD(student.parameters(), lr=0.0),
            rb,
            cfg,
            step=0,
            progress=lambda name, n: scored.append((name, n)),
        )
    finally:
        weighting._RULES.pop("test-ones", None)
    assert stats["pg"] == pytest.approx(-1.0, rel=1e-5)
    assert stats["pcsd"] == 0.0 and stats["gap_mean"] == 0.0 and stats["weight_mean"] == 0.0
    assert ("scoring", 1) in scored  # the reference alone (one epoch: pi_old from the update's pass)


# ----------------------------------------------------------------------------- configuration
def test_unknown_key_lists_valid_keys():
    with pytest.raises(ConfigError, match=r"unknown config key 'optim\.lrr'.*optim\.lr"):
        load_config(["optim.lrr=1"])
    with pytest.raises(ConfigError) as exc:  # "did you mean" and the keys of its group, not every key
        load_config(["optim.lrr=1"])
    msg = str(exc.value)
    assert "did you mean optim.lr" in msg and "(the keys of optim: " in msg and "optim.sft_steps" in msg
    assert "rollout." not in msg and "algo." not in msg and "env." not in msg
    with pytest.raises(ConfigError, match="not key=value"):
        load_config(["optim.lr"])


def test_bad_value_lists_choices():
    with pytest.raises(ConfigError, match="rollout.backend='tpu' is not valid; choose one of vllm, hf"):
        load_config(["rollout.backend=tpu"])
    with pytest.raises(ConfigError, match="rule='nope' is not valid; choose one of .*pcsd"):
        load_config(["rule=nope"])
    with pytest.raises(ConfigError, match="optim.steps"):
        load_config(["optim.steps=many"])
    with pytest.raises(ConfigError, match="run.keep_last must be >= 0"):
        load_config(["run.keep_last=-1"])
    with pytest.raises(ConfigError, match="optim.sft_games must be >= 1"):
        load_config(["optim.sft_steps=5", "optim.sft_games=0"])


def test_procedural_task_types_and_rooms_are_checked():
    cfg = load_config(["env.task_types=[pick_and_place_simple,look_at_obj_in_light]", "env.rooms=[bedroom]"])
    assert list(cfg.env.task_types) == ["pick_and_place_simple", "look_at_obj_in_light"]
    with pytest.raises(ConfigError, match="env.task_types has 'pick_up'.*pick_and_place_simple"):
        load_config(["env.task_types=[pick_up]"])
    with pytest.raises(ConfigError, match="env.rooms has 'garage'.*kitchen"):
        load_config(["env.rooms=[garage]"])
    with pytest.raises(ConfigError, match="no room for task type pick_clean_then_place_in_recep"):
        load_config(["env.rooms=[bedroom]", "env.task_types=null"])  # all six; clean needs a kitchen or bathroom
    with pytest.raises(ConfigError, match="env.task_types is empty"):
        load_config(["env.task_types=[]"])


def test_ablation_rule_needs_its_parameter():
    with pytest.raises(
        ConfigError, match=r"rule=pcsd-fixed-n4 is defined by algo\.pcsd\.n_min=4.*method=pcsd-fixed-n4"
    ):
        load_config(["rule=pcsd-fixed-n4"])
    with pytest.raises(ConfigError, match=r"algo\.pcsd\.alpha=1\.0"):
        load_config(["rule=pcsd-no-decay"])
    assert load_config(["rule=pcsd-fixed-n4", "algo.pcsd.n_min=4"]).rule == "pcsd-fixed-n4"


def test_unknown_method_and_preset_list_valid_ones():
    with pytest.raises(ConfigError, match="unknown method 'ppo'; valid methods: vanilla, skill-prompt, grpo"):
        load_config(["method=ppo"])
    with pytest.raises(ConfigError, match="unknown preset 'big'; valid presets: .*tiny-cpu"):
        load_config(["preset=big"])


def test_every_method_resolves_with_every_preset():
    """... without a word: the presets spell out PCSD's keys at their defaults, so switching the
    method warns about no key the method does not read (pcsd.train.config.ConfigWarning). A preset
    without a skills folder (TextArena's: its teacher reads the game's hidden state) refuses, in one
    line, the methods that show skills to the student."""
    import warnings

    from pcsd.train.config import ConfigWarning, available_presets

    for preset in available_presets():
        if "webshop" in preset:  # need $WEBSHOP_DATA: tests/test_webshop_wiring.py checks them
            continue
        for m in available_methods():
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    cfg = load_config([f"preset={preset}", f"method={m}"])
                except ConfigError as exc:
                    assert preset == "tiny-cpu-textarena", (preset, m, str(exc))
                    assert "shows the skills in the student's prompts" in str(exc), (m, str(exc))
                    continue
            assert not [w for w in caught if issubclass(w.category, ConfigWarning)], (preset, m)
            assert cfg.method == m and cfg.preset == preset
            for key, val in METHODS[m]["overrides"].items():
                from omegaconf import OmegaConf

                assert OmegaConf.select(cfg, key) == val, (preset, m, key)


def test_methods_set_what_the_paper_says():
    c = load_config(["method=vanilla"])
    assert c.optim.steps == 0 and not c.eval.skills
    assert load_config(["method=skill-prompt"]).eval.skills
    c = load_config(["method=grpo"])
    assert c.algo.grpo and not c.algo.distill
    c = load_config(["method=opsd"])
    assert not c.algo.grpo and c.algo.distill and c.rule == "sdar"
    assert load_config(["method=grpo+opsd"]).rule == "uniform"
    assert load_config(["method=rlsd"]).rule == "rlsd"
    c = load_config(["method=skill-grpo"])
    assert c.algo.student_skills and not c.eval.skills
    c = load_config(["method=skill-grpo*"])  # the starred alias
    assert c.method == "skill-grpo-star" and c.algo.student_skills and c.eval.skills
    assert load_config(["method=pcsd-fixed-n4"]).algo.pcsd.n_min == 4
    assert load_config(["method=pcsd-no-decay"]).algo.pcsd.alpha == 1.0
    # overrides after the method win; the preset's own method is used without method=
    assert load_config(["method=pcsd", "algo.lambda_distill=0.005"]).algo.lambda_distill == 0.005
    assert load_config(["preset=tiny-cpu-grpo"]).algo.distill is False
    c = load_config(["method=skill-sd"])  # the method table: G = 8 and clip 0.2 from the preset
    assert c.algo.grpo and c.algo.distill and c.rule == "skill-sd" and c.algo.lambda_distill == 0.001
    assert not c.algo.student_skills and not c.eval.skills
    c = load_config(["method=skill-sd*"])
    assert c.method == "skill-sd-star" and c.rule == "skill-sd" and c.eval.skills


def test_record_gaps_is_a_validated_key():
    assert load_config([]).run.record_gaps is False
    assert load_config(["run.record_gaps=true"]).run.record_gaps is True
    with pytest.raises(ConfigError, match="record_gaps"):
        load_config(["run.record_gaps=maybe"])


def test_grpo_comparison_preset_differs_from_the_default_only_in_the_method():
    """tiny-cpu-grpo is the default's comparison run: same model, games, seeds, rollout, optimiser
    and evaluation; only the preset name, the method and the distillation switch differ."""
    from pcsd.train.config import config_diff

    default, grpo = load_config([]), load_config(["preset=tiny-cpu-grpo"])
    assert config_diff(default, grpo) == ["algo.distill", "method", "preset"]
    assert default.algo.distill and not grpo.algo.distill and grpo.method == "grpo"


def test_resume_refuses_changes_of_meaning(tmp_path):
    from omegaconf import OmegaConf

    cfg = load_config(["optim.steps=3", f"run.dir={tmp_path}"])
    OmegaConf.save(cfg, tmp_path / "config.yaml", resolve=True)
    ok = resume_config(tmp_path, ["run.stop_after=2", "run.save_every=1"])
    assert ok.run.resume == str(tmp_path.resolve()) and ok.run.stop_after == 2 and ok.optim.steps == 3
    with pytest.raises(ConfigError, match=rf"optim\.lr: {cfg.optim.lr} -> 0\.5.*may change only"):
        resume_config(tmp_path, ["optim.lr=0.5"])
    with pytest.raises(ConfigError, match="method=sdar.*made with method=pcsd"):
        resume_config(tmp_path, ["method=sdar"])
    with pytest.raises(ConfigError, match="no config.yaml"):
        resume_config(tmp_path / "missing", [])


def test_cli_errors_exit_2(capsys):
    from pcsd.train.cli import main

    assert main(["method=ppo"]) == 2
    assert "valid methods" in capsys.readouterr().err
    assert main(["--resume"]) == 2
    assert main(["--bogus"]) == 2
    assert "unknown option" in capsys.readouterr().err


# ----------------------------------------------------------------------------- runs
_TINY = tiny_run("optim.lr=1e-2")


def _records(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]


def test_smoke_run_then_stop_and_resume_is_bit_exact(tmp_path, tiny_dir, child_env):
    """``python -m pcsd.train`` for 2 steps writes config.yaml, summary.json and checkpoints; a run
    stopped after step 1 and resumed computes step 2's loss bit for bit like the uninterrupted one."""
    from safetensors.torch import load_file

    def train(*args: str) -> None:  # each run in its own process, all with the same environment
        r = subprocess.run(
            [sys.executable, "-m", "pcsd.train", *args],
            cwd=tmp_path,
            env=child_env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    common = _TINY + [f"model.path={tiny_dir}"]
    full = tmp_path / "full"
    train(*common, f"run.dir={full}")
    assert (full / "config.yaml").is_file()
    summary = json.loads((full / "summary.json").read_text())
    for key in ("success_before", "success_after", "steps", "wall_seconds"):
        assert key in summary, key
    assert summary["steps"] == 2 and summary["method"] == "pcsd"
    assert (full / "checkpoints" / "step-00000002" / "COMPLETE").is_file()

    part = tmp_path / "part"
    train(*common, f"run.dir={part}", "run.stop_after=1")
    stopped = json.loads((part / "summary.json").read_text())
    assert stopped["stopped_after"] == 1 and stopped["success_after"] is None
    assert [r["step"] for r in _records(part)] == [1]
    train("--resume", str(part))

    a, b = _records(full), _records(part)
    assert [r["step"] for r in b] == [1, 2]  # metrics appended, not restarted
    for key in ("loss", "pg", "kl", "pcsd", "grad_norm", "gap_mean", "reward", "tokens"):
        assert a[1][key] == b[1][key], (key, a[1][key], b[1][key])  # bit for bit
    assert a[1]["loss"] != 0.0
    wa = load_file(str(full / "checkpoints" / "step-00000002" / "model" / "model.safetensors"))
    wb = load_file(str(part / "checkpoints" / "step-00000002" / "model" / "model.safetensors"))
    w1 = load_file(str(part / "checkpoints" / "step-00000001" / "model" / "model.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert any(not torch.equal(wa[k], w1[k]) for k in wa)  # step 2 really moved the weights
    # the episode records: every step once after the resume, step 2's as the uninterrupted run's
    from pcsd.view.files import episode_files

    assert [(step, name) for step, name, _ in episode_files(part) if name == "train"] == [(1, "train"), (2, "train")]
    for f in ("step_000002.jsonl", "step_000001.jsonl"):
        assert (full / "episodes" / f).read_text() == (part / "episodes" / f).read_text()
    resumed = json.loads((part / "summary.json").read_text())
    assert resumed["success_before"] == summary["success_before"]
    assert resumed["success_after"] == summary["success_after"] and resumed["steps"] == 2


@pytest.mark.parametrize("prompt_weight", [0.0, 0.5])
def test_sft_loss_is_response_nll_plus_weighted_prompt_nll(tmp_path, tiny_dir, prompt_weight):
    """sft_warmup's first loss == the plain full-logit computation on the same sampled examples:
    mean NLL of the expert's response tokens + prompt_weight x mean next-token NLL of the prompt;
    the examples are the student's rollout prompts with the expert's think/action response."""
    import random

    from pcsd.envs.procedural import write_games as procedural_games
    from pcsd.models import eos_id
    from pcsd.text.prompts import PromptBuilder
    from pcsd.train.sft import expert_episodes, sft_examples, sft_warmup, think_for

    builder = PromptBuilder("alfworld", history_length=2, max_prompt_tokens=1024, tokenizer_dir=tiny_dir)
    games = procedural_games(
        tmp_path / "g", 2, 77, ("pick_and_place_simple",), rooms=("bedroom",), receptacles=6, distractors=0
    )
    model, _ = _models(tiny_dir)
    plain = copy.deepcopy(model)
    episodes = expert_episodes(games, 6)
    examples = sft_examples(builder, episodes, eos_id(builder))
    assert len(examples) == sum(len(ep.steps) for ep in episodes) > 0
    # the plain construction of the same examples
    want_examples = []
    for ep in episodes:
        hist = []
        for obs, adm, action in ep.steps:
            ((_, ids),) = builder.build_batch(
                [dict(task=ep.task, observation=obs, admissible=adm, history=hist, step=len(hist))]
            )
            text = f"<think>{think_for(ep.task, action)}</think><action>{action}</action>"
            want_examples.append((list(ids), builder.tokenizer.encode(text) + [eos_id(builder)]))
            hist = hist + [(obs, action)]
    assert examples == want_examples
    losses = sft_warmup(model, examples, steps=1, lr=0.0, seed=4, prompt_weight=prompt_weight, batch_size=16)
    rng = random.Random(4)
    chunk = [examples[rng.randrange(len(examples))] for _ in range(16)]
    resp_nll, prompt_nll = [], []
    with torch.no_grad():
        for p, r in chunk:
            seq = torch.tensor([list(p) + list(r)])
            lp = plain(input_ids=seq).logits[0].float().log_softmax(-1)
            tok = lp[:-1].gather(1, seq[0, 1:, None]).squeeze(1)
            prompt_nll.append(-tok[: len(p) - 1])
            resp_nll.append(-tok[len(p) - 1 :])
    want = torch.cat(resp_nll).mean() + prompt_weight * torch.cat(prompt_nll).mean()
    assert losses[0] == pytest.approx(float(want), rel=1e-4)


def test_sft_bad_arguments_name_themselves(tiny_dir):
    from pcsd.train.sft import sft_warmup

    model, _ = _models(tiny_dir)
    ex = [([5, 6, 7], [8, 2])]
    for kw, name in (
        (dict(prompt_weight=-1.0), "prompt_weight"),
        (dict(batch_size=0), "batch_size"),
        (dict(schedule="linear"), "schedule"),
    ):
        with pytest.raises(ValueError, match=name):
            sft_warmup(model, ex, steps=1, lr=0.0, **kw)
    with pytest.raises(ValueError, match="examples is empty"):
        sft_warmup(model, [], steps=1, lr=0.0)


def test_sft_teacher_share_adds_skill_prompts_with_the_same_responses(tmp_path, tiny_dir):
    """teacher_share=1: every step twice, the second time with the teacher's prompt (the skills
    block prepended to the same student prompt) and the same response; 0: student prompts only."""
    from pcsd.envs.procedural import write_games as procedural_games
    from pcsd.models import eos_id
    from pcsd.text.prompts import PromptBuilder
    from pcsd.train.sft import expert_episodes, sft_examples

    builder = PromptBuilder("alfworld", history_length=2, max_prompt_tokens=None, tokenizer_dir=tiny_dir)
    games = procedural_games(
        tmp_path / "g", 2, 78, ("pick_and_place_simple",), rooms=("bedroom",), receptacles=6, distractors=0
    )
    episodes = expert_episodes(games, 6)
    plain = sft_examples(builder, episodes, eos_id(builder))
    both = sft_examples(builder, episodes, eos_id(builder), teacher_share=1.0)
    assert len(both) == 2 * len(plain) and both[0::2] == plain
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tiny_dir / "tokenizer.json"))
    assert "[Privileged Skill Information]" in tok.decode(both[1][0])
    assert "[Privileged Skill Information]" not in tok.decode(both[0][0])
    assert all(t[1] == p[1] for t, p in zip(both[1::2], plain))
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="teacher_share"):
            sft_examples(builder, episodes, eos_id(builder), teacher_share=bad)
    with pytest.raises(ConfigError, match="optim.sft_teacher_share must be in"):
        load_config(["optim.sft_teacher_share=2"])


def test_sft_schedule_warms_up_then_decays():
    from pcsd.train.sft import lr_factor

    f = [lr_factor(s, 100) for s in range(100)]
    assert f[0] == pytest.approx(0.2) and f[4] == pytest.approx(1.0)  # 5 warm-up steps
    assert all(a >= b for a, b in zip(f[4:], f[5:])) and 0 < f[-1] < 0.01
    assert [lr_factor(s, 10, "constant") for s in range(10)] == [1.0] * 10


def test_game_corpus_makes_every_name_one_token(tmp_path):
    """The tokenizer trained with the games' text holds each object/receptacle name whole."""
    from tokenizers import Tokenizer

    from pcsd.envs.procedural import write_games as procedural_games
    from pcsd.tiny_model import make_tiny_model
    from pcsd.train.sft import expert_episodes, game_corpus

    games = procedural_games(tmp_path / "g", 12, 5, distractors=4)
    episodes = expert_episodes(games, 8)
    corpus = game_corpus(episodes)
    assert any(line.startswith("Your task is to: ") for line in corpus)
    d = make_tiny_model(tmp_path / "m", corpus=corpus)
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    import re

    names = {n for ep in episodes for obs, _, _ in ep.steps for n in re.findall(r"\b([a-z]+) \d+", obs)}
    assert len(names) > 10
    split = [n for n in names if len(tok.encode(" " + n).ids) != 1]
    assert not split, split
    with pytest.raises(TypeError, match="corpus"):
        make_tiny_model(tmp_path / "bad", corpus="one string")


@pytest.mark.parametrize(
    "task, parts",
    [
        ("put a plate in cabinet.", ("plate", "cabinet")),
        ("put some spraybottle on toilet.", ("spraybottle", "toilet")),
        ("put a clean plate in microwave.", ("plate", "microwave")),
        ("put a hot mug in sidetable.", ("mug", "sidetable")),
        ("put a cool tomato in countertop.", ("tomato", "countertop")),
        ("clean some lettuce and put it in fridge.", ("lettuce", "fridge")),
        ("heat some egg and put it in garbagecan.", ("egg", "garbagecan")),
        ("cool some mug and put it on shelf.", ("mug", "shelf")),
        ("put two cellphone in bed.", ("cellphone", "bed")),
        ("find two book and put them in sidetable.", ("book", "sidetable")),
        ("look at bowl under the desklamp.", ("bowl", "desklamp")),
        ("examine the book with the desklamp.", ("book", "desklamp")),
        ("go to the kitchen.", None),
        ("", None),
    ],
)
def test_task_parts_reads_every_alfworld_template(task, parts):
    from pcsd.train.sft import task_parts, think_for

    assert task_parts(task) == parts
    think = think_for(task, "take plate 1 from cabinet 2")
    assert think == (f"{parts[0]} to {parts[1]}. Next: take." if parts else "Next: take.")


def test_task_parts_reads_every_shared_and_generated_task(alfworld_data):
    """Every task sentence of the shared games and of generated games of the six types yields its
    object and target, both words of the sentence."""
    from pcsd.envs.alfworld import TASK_TYPES, AlfworldGame
    from pcsd.train.sft import task_parts

    tasks = [AlfworldGame.from_file(p).task for p in sorted((alfworld_data / "json_2.1.1").rglob("game.tw-pddl"))]
    tasks += [AlfworldGame.generate(t, seed).task for t in TASK_TYPES for seed in range(20)]
    assert len(tasks) > 120
    unread = [t for t in tasks if task_parts(t) is None]
    assert not unread, unread[:5]
    for t in tasks:
        obj, target = task_parts(t)
        assert obj in t.split() and target.rstrip(".") in t.replace(".", " ").split(), t


def test_smoke_of_the_default_path_with_its_warm_up(tmp_path):
    """The default's own path, shortened: no model.path (the tiny model is generated with a
    tokenizer trained on the warm-up games), the expert's SFT, one RL step, both evaluations."""
    from pcsd.train.cli import main

    run = tmp_path / "run"
    assert (
        main(
            [
                f"run.dir={run}",
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
            ]
        )
        == 0
    )
    s = json.loads((run / "summary.json").read_text())
    assert s["preset"] == "tiny-cpu" and s["steps"] == 1
    assert s["sft_examples"] > 0 and s["sft_expert_success"] >= 0 and len(s["sft_loss_first_last"]) == 2
    assert (run / "sft-model" / "config.json").is_file() and (run / "base-model" / "tokenizer.json").is_file()
    assert s["success_before"] is not None and s["success_after"] is not None


def test_skill_sd_trains_and_records_gaps_the_diagnostics_read(tmp_path, tiny_dir):
    """``method=skill-sd`` runs two RL steps of the tiny preset (small sizes): the distillation term
    is non-zero and the weights move; with ``run.record_gaps=true`` every logged step leaves an npz
    that :mod:`pcsd.diagnostics` reads."""
    from pcsd.train.cli import main
    from pcsd.train.gaps import load_gap_records

    run = tmp_path / "run"
    assert (
        main(
            _TINY
            + [
                f"model.path={tiny_dir}",
                f"run.dir={run}",
                "method=skill-sd",
                "run.record_gaps=true",
                "rollout.max_response_tokens=6",
                "algo.teacher=frozen",
            ]
        )
        == 0
    )
    s = json.loads((run / "summary.json").read_text())
    assert s["method"] == "skill-sd" and s["rule"] == "skill-sd" and s["steps"] == 2
    recs = _records(run)
    assert [r["step"] for r in recs] == [1, 2]
    assert all(r["pcsd"] != 0.0 and math.isfinite(r["loss"]) for r in recs)
    gaps = load_gap_records(run)
    assert [g.step for g in gaps] == [1, 2] and all(g.rule == "skill-sd" for g in gaps)
    for g in gaps:
        assert g.gap.shape == g.mask.shape == g.weights.shape == g.teacher_logp.shape
        assert g.cu_seqlens[0] == 0 and g.cu_seqlens[-1] == g.num_tokens and g.mask.all()
        np.testing.assert_allclose(g.gap, g.teacher_logp - g.student_logp, atol=1e-5)
    # the episode records (run.log_episodes, default 4 a step) hold the update's own numbers: per turn
    # as many tokens as the recorded row, and the same float32 gaps, weights and log-probs
    from pcsd.view.files import episode_files

    files = [(step, path) for step, name, path in episode_files(run) if name == "train"]
    assert [step for step, _ in files] == [g.step for g in gaps] == [1, 2]
    for (_, path), g in zip(files, gaps):
        recs = [json.loads(x) for x in path.read_text().splitlines()]
        assert len(recs) == 2 and all(r["token_values"] and r["turns"] for r in recs)  # 1 task x 2 rollouts
        assert sorted(r["traj"] for r in recs) == [0, 1]
        for r in recs:
            rows = np.flatnonzero(g.row_traj == r["traj"])
            assert [int(g.row_turn[i]) for i in rows] == [t["turn"] for t in r["turns"]]
            assert r["reward"] == float(g.traj_reward[r["traj"]])
            for i, t in zip(rows, r["turns"]):
                lo, hi = int(g.cu_seqlens[i]), int(g.cu_seqlens[i + 1])
                assert len(t["tokens"]) == hi - lo > 0
                for name, arr in (("gap", g.gap), ("weight", g.weights), ("student_logp", g.student_logp)):
                    np.testing.assert_array_equal(np.float32(t[name]), arr[lo:hi], err_msg=name)
                np.testing.assert_array_equal(np.float32(t["teacher_logp"]), g.teacher_logp[lo:hi])
    assert any(x != 0 for r in recs for t in r["turns"] for x in t["gap"])  # (skill-sd's weights are all 0)
    assert (run / "view" / "index.html").is_file()  # the page, written at the run's end
    from pcsd.diagnostics.cli import main as diag

    out = tmp_path / "diag"
    assert (
        diag(
            [
                "rank-robustness",
                "--run-dir",
                str(run),
                "--out",
                str(out),
                "--repeats",
                "2",
                "--rules",
                "pcsd,sdar",
                "--quiet",
            ]
        )
        == 0
    )
    d = json.loads((out / "diagnostics.json").read_text())["rank_robustness"]
    assert d["num_tokens"] == sum(g.num_tokens for g in gaps) and "recorded steps 1..2" in d["source"]
