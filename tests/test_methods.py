"""The method table as the paper states it (issue 22, part 3): OPSD keeps the KL penalty, one gate
sharpness for every gated rule and a warning for every key the method does not read, RLSD's
lambda schedule as the public code runs it, and SDAR with normalised weights as its own method."""

from __future__ import annotations

import warnings

import pytest
import torch
from omegaconf import OmegaConf

from pcsd.tiny_model import plain_logprobs, student_and_frozen
from pcsd.train.config import ConfigWarning, load_config, resume_config
from pcsd.train.methods import METHODS, available_methods, unused_keys

SMALL = [
    "rollout.backend=hf",
    "optim.tokens_per_microbatch=60",
    "rollout.max_prompt_tokens=40",
    "rollout.max_response_tokens=20",
    "optim.grad_clip=1e9",
]


def _load(overrides):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = load_config(overrides)
    return cfg, [str(w.message) for w in caught if issubclass(w.category, ConfigWarning)]


# ----------------------------------------------------------------------------- 3.1 OPSD keeps KL
# The gradient of method=opsd against plain autograd of kl_beta x KL + lambda x the sdar-weighted
# loss: tests/test_train.py::test_total_loss_gradients_match_plain_autograd[opsd, opsd-unfused].
def test_opsd_keeps_the_kl_term_and_drops_the_policy_gradient(tiny_dir):
    from pcsd.tiny_model import synthetic_rollout_batch
    from pcsd.train.update import update_step

    cfg = load_config(SMALL + ["method=opsd"])
    assert not cfg.algo.grpo and cfg.algo.kl_beta == 0.01 and cfg.rule == "sdar" and cfg.algo.lambda_distill == 0.01
    student, frozen = student_and_frozen(tiny_dir, 0.05)
    rb = synthetic_rollout_batch(num_groups=2, group_size=2, seed=5, turns=(1, 2))
    stats = update_step(student, frozen, torch.optim.SGD(student.parameters(), lr=0.0), rb, cfg, step=0)
    assert stats["kl"] > 0 and stats["pg"] == 0.0 and stats["clip_frac"] == 0.0
    assert "algo.kl_beta" not in unused_keys(cfg)


# ----------------------------------------------------------------------------- 3.2 one gate sharpness
@pytest.mark.parametrize("method", ["opsd", "sdar", "sdar-norm", "pcsd", "pcsd-no-trend"])
def test_every_gated_rule_reads_algo_pcsd_beta_gate(tiny_dir, method):
    """The weights update_step gives the distillation loss (recorded as run.record_gaps does) are
    the rule's at the configured algo.pcsd.beta_gate, not at a fixed 5 (before the fix sdar and opsd
    read their own beta of 5.0)."""
    from pcsd.ops.weighting import get_rule
    from pcsd.tiny_model import synthetic_rollout_batch
    from pcsd.train.update import update_step

    cfg = load_config(SMALL + [f"method={method}", "algo.pcsd.beta_gate=1.5"])
    student, frozen = student_and_frozen(tiny_dir, 0.05)
    rb = synthetic_rollout_batch(num_groups=2, group_size=2, seed=1, turns=(1, 2))
    rec = {}
    update_step(student, frozen, torch.optim.SGD(student.parameters(), lr=0.0), rb, cfg, step=0, record=rec.update)
    gap, mask, cu = (torch.as_tensor(rec[k]) for k in ("gap", "mask", "cu_seqlens"))
    rule = get_rule(cfg.rule)
    params = {k: v for k, v in dict(cfg.algo.pcsd).items() if k in rule.defaults}
    assert params["beta_gate"] == 1.5
    torch.testing.assert_close(torch.as_tensor(rec["weights"]), rule(gap, cu, mask, **params), rtol=1e-5, atol=1e-6)
    at5 = rule(gap, cu, mask, **{**params, "beta_gate": 5.0})
    assert not torch.allclose(torch.as_tensor(rec["weights"]), at5, atol=1e-3)


def test_the_gated_rules_share_one_parameter_with_the_papers_default():
    from pcsd.ops.weighting import get_rule

    assert load_config([]).algo.pcsd.beta_gate == 5.0  # the paper's tables: OPSD, SDAR, PCSD 5.0
    for name in ("pcsd", "pcsd-fixed-n1", "pcsd-fixed-n4", "pcsd-no-trend", "pcsd-no-decay", "sdar", "sdar-norm"):
        assert get_rule(name).defaults["beta_gate"] == 5.0, name
    assert "beta_gate" not in get_rule("uniform").defaults  # GRPO+OPSD: the gate at 0 by definition


@pytest.mark.parametrize(
    "overrides,key",
    [
        (["method=sdar", "algo.pcsd.gamma=0.5"], "algo.pcsd.gamma"),
        (["method=opsd", "algo.pcsd.n_max=4"], "algo.pcsd.n_max"),
        (["method=grpo", "algo.lambda_distill=0.05"], "algo.lambda_distill"),
        (["method=grpo", "algo.pcsd.beta_gate=3"], "algo.pcsd.beta_gate"),
        (["method=grpo", "rule=sdar"], "rule"),
        (["method=rlsd", "algo.lambda_distill=0.1"], "algo.lambda_distill"),
        (["method=rlsd", "algo.pcsd.beta_gate=2"], "algo.pcsd.beta_gate"),
        (["method=opsd", "algo.clip_eps=0.3"], "algo.clip_eps"),
        (["method=opsd", "algo.kl_beta=0", "algo.loss_agg=token-mean"], "algo.loss_agg"),
        (["method=grpo+opsd", "algo.pcsd.beta_gate=0"], "algo.pcsd.beta_gate"),
        (["method=skill-sd", "algo.pcsd.alpha=0.5"], "algo.pcsd.alpha"),
        (["method=pcsd-fixed-n4", "algo.pcsd.tau_low=0.1"], "algo.pcsd.tau_low"),
        (["method=pcsd-no-trend", "algo.pcsd.gamma=0.1"], "algo.pcsd.gamma"),
        (["method=skill-grpo", "algo.teacher=current"], "algo.teacher"),
        (["method=pcsd", "algo.gigpo.gamma=0.9"], "algo.gigpo.gamma"),
        (
            ["method=sdar", "algo.estimator=gigpo", "algo.gigpo.step_weight=0", "algo.gigpo.gamma=0.9"],
            "algo.gigpo.gamma",
        ),
        (["method=pcsd", "algo.estimator=rloo", "algo.adv_eps=1e-4"], "algo.adv_eps"),
        (["method=grpo", "algo.estimator=gigpo", "algo.gigpo.norm=mean", "algo.adv_eps=1e-4"], "algo.adv_eps"),
        (["method=opsd", "algo.estimator=gigpo"], "algo.estimator"),
        (["method=opsd", "algo.policy_loss=gspo"], "algo.policy_loss"),
        (["method=opsd", "algo.clip_eps_high=0.28"], "algo.clip_eps_high"),
        (["method=pcsd", "rollout.max_sample_batches=5"], "rollout.max_sample_batches"),
    ],
)
def test_a_key_without_effect_under_the_method_is_warned_about_once(overrides, key):
    cfg, msgs = _load(overrides)
    mine = [m for m in msgs if m.startswith(f"{key}=")]
    assert len(mine) == 1, msgs
    assert f"has no effect under method={cfg.method}" in mine[0]
    assert key in unused_keys(cfg)


@pytest.mark.parametrize(
    "overrides",
    [
        ["method=sdar", "algo.pcsd.beta_gate=2"],
        ["method=opsd", "algo.kl_beta=0.02", "algo.lambda_distill=0.02"],
        ["method=pcsd", "algo.pcsd.gamma=0.5"],
        ["method=grpo", "algo.clip_eps=0.3", "algo.kl_beta=0.05"],
        ["method=rlsd", "algo.teacher=current"],
        ["method=skill-sd", "algo.lambda_distill=0.002"],
        ["method=pcsd-fixed-n4", "algo.pcsd.n_max=6"],
        ["method=vanilla", "algo.lambda_distill=0.05"],
        ["method=pcsd", "algo.estimator=gigpo", "algo.gigpo.gamma=0.9", "algo.gigpo.norm=mean"],
        ["method=sdar", "algo.policy_loss=gspo", "algo.clip_eps_high=0.28", "rollout.dynamic_sampling=true"],
        ["method=rlsd", "algo.estimator=rloo", "rollout.dynamic_sampling=true", "rollout.max_sample_batches=2"],
    ],
)
def test_a_key_the_method_reads_is_not_warned_about(overrides):
    assert _load(overrides)[1] == []


def test_switching_the_method_on_a_paper_preset_is_neither_refused_nor_warned_about():
    """The paper presets spell out every PCSD key at its default: any method on them resolves
    without a word (tests/test_train.py checks every method on every preset the same way)."""
    for m in ("grpo", "opsd", "rlsd", "sdar", "skill-sd", "grpo+opsd", "pcsd-fixed-n4"):
        assert _load(["preset=alfworld-qwen2.5-3b", f"method={m}"])[1] == [], m


def test_a_saved_config_with_an_unread_value_warns_once_on_resume(tmp_path):
    cfg = load_config(["method=sdar", "optim.steps=3", f"run.dir={tmp_path}"])
    cfg.algo.pcsd.gamma = 0.4  # e.g. a preset of its own, or a run made before the rule read it
    OmegaConf.save(cfg, tmp_path / "config.yaml", resolve=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resume_config(tmp_path, ["run.stop_after=2"])
    msgs = [str(w.message) for w in caught if issubclass(w.category, ConfigWarning)]
    assert msgs == ["algo.pcsd.gamma=0.4 has no effect under method=sdar: rule sdar reads algo.pcsd.beta_gate"]


def test_the_cli_prints_each_warning_as_one_line(capsys):
    from pcsd.train.cli import main

    assert main(["preset=alfworld-qwen2.5-3b", "method=sdar", "algo.pcsd.gamma=0.5", "--plan"]) == 0
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "pcsd.train: warning: algo.pcsd.gamma=0.5 has no effect under method=sdar: rule sdar reads algo.pcsd.beta_gate"
    ]


def test_every_method_sets_only_keys_it_reads():
    """No method's own overrides (e.g. pcsd-fixed-n4's n_min=4, skill-sd's lambda) are unread."""
    for m in available_methods():
        cfg = load_config([f"method={m}", "optim.steps=1"])
        unread = set(unused_keys(cfg)) & set(METHODS[m]["overrides"])
        assert unread <= {"rule"} and (not unread or not cfg.algo.distill), (m, unread)


def test_a_rule_defined_by_a_parameter_refuses_another_value():
    """pcsd-fixed-n1 is N = 1 (it read algo.pcsd.n_min, so n_min=2 silently ran another window)."""
    from pcsd.train.config import ConfigError

    with pytest.raises(ConfigError, match=r"rule=pcsd-fixed-n1 is defined by algo\.pcsd\.n_min=1.*n_min=2"):
        load_config(["method=pcsd-fixed-n1", "algo.pcsd.n_min=2"])
    assert load_config(["method=pcsd-fixed-n1"]).algo.pcsd.n_min == 1


# ----------------------------------------------------------------------------- 3.3 RLSD's schedule
def test_rlsd_lambda_schedule_first_and_last_values():
    """The public RLSD trainer: global_steps = 1 at the first update, lambda = 0.5 (1 - step / 100),
    0 from step 100 on; 150 updates in the paper."""
    from pcsd.ops.weighting import rlsd_lambda

    assert rlsd_lambda(1) == pytest.approx(0.495)
    assert rlsd_lambda(99) == pytest.approx(0.005)
    assert rlsd_lambda(100) == 0.0 and rlsd_lambda(150) == 0.0


@pytest.mark.parametrize("step,update,lam", [(0, 1, 0.495), (98, 99, 0.005), (149, 150, 0.0)])
def test_the_update_applies_rlsd_at_its_update_number(tiny_dir, monkeypatch, step, update, lam):
    """update_step's 0-based step k is update k + 1 of the schedule: the first update mixes with
    0.495 (before the fix: 0.5, one step late), the last (k = 149) with 0; the advantages the
    update uses are the transform at that lambda."""
    import pcsd.ops.weighting as W
    from pcsd.tiny_model import synthetic_rollout_batch
    from pcsd.train.update import update_step

    seen = []
    real = W.rlsd_lambda
    monkeypatch.setattr(W, "rlsd_lambda", lambda s, *a: seen.append(s) or real(s, *a))
    cfg = load_config(SMALL + ["method=rlsd", "optim.steps=150"])
    student, frozen = student_and_frozen(tiny_dir, 0.05)
    rb = synthetic_rollout_batch(num_groups=2, group_size=2, seed=4, turns=(1, 1))
    stats = update_step(student, frozen, torch.optim.SGD(student.parameters(), lr=0.0), rb, cfg, step=step)
    assert set(seen) == {update} and real(update) == pytest.approx(lam)
    # ratio 1 (one epoch): the policy term is -sum c A_t with A_t the transform at lambda(update)
    from pcsd.ops.grpo import group_advantages, token_coefficients

    with torch.no_grad():
        old = plain_logprobs(student, rb.prompt_ids, rb.response_ids)
        teacher = plain_logprobs(frozen, rb.teacher_prompt_ids, rb.response_ids)
    traj = rb.token_traj_ids()
    mask = torch.ones_like(old, dtype=torch.bool)
    adv = group_advantages(rb.reward, rb.traj_group)[traj].float()
    factor = torch.exp(torch.sign(adv) * (teacher - old)).clamp(0.8, 1.2)
    coef = token_coefficients(mask, traj, rb.num_trajectories, cfg.algo.loss_agg).float()
    want = -float((coef * adv * ((1 - lam) + lam * factor)).sum())
    assert stats["pg"] == pytest.approx(want, rel=1e-4, abs=1e-6)


# ----------------------------------------------------------------------------- 3.5 SDAR normalised
def test_sdar_norm_is_its_own_method_and_sdar_is_unchanged():
    c = load_config(["method=sdar-norm"])
    assert c.rule == "sdar-norm" and c.algo.grpo and c.algo.distill and c.algo.lambda_distill == 0.01
    assert load_config(["method=sdar-norm*"]).eval.skills
    assert load_config(["method=sdar"]).rule == "sdar"
    from pcsd.eval.games import RULE_LABELS

    assert RULE_LABELS["sdar-norm"] == "SDAR-norm" and RULE_LABELS["sdar"] == "SDAR"


def test_sdar_norm_trains(tiny_dir):
    """update_step with sdar-norm: every parameter moves, the recorded weights average 1 per turn."""
    import numpy as np

    from pcsd.tiny_model import synthetic_rollout_batch
    from pcsd.train.update import update_step

    cfg = load_config(SMALL + ["method=sdar-norm", "optim.lr=1e-3", "algo.lambda_distill=0.5"])
    student, frozen = student_and_frozen(tiny_dir, 0.02)
    before = {n: p.detach().clone() for n, p in student.named_parameters()}
    rec = {}
    update_step(
        student,
        frozen,
        torch.optim.AdamW(student.parameters(), lr=1e-3),
        synthetic_rollout_batch(num_groups=2, group_size=2, seed=2),
        cfg,
        step=0,
        record=rec.update,
    )
    assert not [n for n, p in student.named_parameters() if torch.equal(p.detach(), before[n])]
    cu, w = rec["cu_seqlens"], rec["weights"]
    means = [w[a:b].mean() for a, b in zip(cu[:-1], cu[1:]) if b > a]
    np.testing.assert_allclose(means, 1.0, rtol=1e-5)
