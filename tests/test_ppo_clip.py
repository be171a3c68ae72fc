"""The clipped ratio where it acts (issue 22, part 5): the trainer's per-token GRPO terms against a
literal loop with ratios far from 1, update_step with two PPO epochs and a learning rate against a
plain two-epoch reference (the second epoch's ratios leave the clip range), and the lower bound
of algo.clip_eps."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pcsd.ops.grpo import grpo_token_terms
from pcsd.tiny_model import plain_logprobs
from pcsd.train.config import ConfigError, load_config


def loop_token_terms(logp, old, ref, adv, clip):
    """Per token, in Python floats: -min(rho A, clip(rho, 1 - eps, 1 + eps) A), the k3 KL
    exp(ref - logp) - (ref - logp) - 1, whether the clipped branch is the smaller one, and the
    derivative of the policy term with respect to logp (0 where the clipped branch is taken)."""
    out = []
    for lp, o, r, a in zip(logp, old, ref, adv):
        rho = math.exp(lp - o)
        unclipped, clipped = rho * a, min(max(rho, 1 - clip), 1 + clip) * a
        taken = clipped < unclipped
        d = r - lp
        out.append((-min(unclipped, clipped), math.exp(d) - d - 1, taken, 0.0 if taken else -rho * a))
    return out


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 40),
    seed=st.integers(0, 2**31 - 1),
    spread=st.floats(0.05, 1.5),
    clip=st.sampled_from([0.1, 0.2, 0.28, 0.5]),
)
def test_grpo_token_terms_match_a_loop_with_ratios_away_from_one(n, seed, spread, clip):
    """Ratios exp(N(0, spread)) reach far outside [1 - eps, 1 + eps] on both sides, for positive
    and negative advantages: values, the clipped indicator and the gradient all match the loop."""
    g = torch.Generator().manual_seed(seed)
    old = torch.randn(n, generator=g, dtype=torch.float64) - 2
    logp = (old + spread * torch.randn(n, generator=g, dtype=torch.float64)).requires_grad_(True)
    ref = old + 0.3 * torch.randn(n, generator=g, dtype=torch.float64)
    adv = torch.randn(n, generator=g, dtype=torch.float64)
    pg, kl, taken = grpo_token_terms(logp, old, ref, adv, clip)
    pg.sum().backward()
    want = loop_token_terms(logp.detach().tolist(), old.tolist(), ref.tolist(), adv.tolist(), clip)
    for i, (p, k, t, dp) in enumerate(want):
        assert float(pg[i].detach()) == pytest.approx(p, rel=1e-12, abs=1e-12), i
        assert float(kl[i].detach()) == pytest.approx(k, rel=1e-12, abs=1e-12), i
        assert bool(taken[i]) == t, i
        assert float(logp.grad[i]) == pytest.approx(dp, rel=1e-12, abs=1e-12), i


def test_the_clip_acts_on_both_sides_of_the_range():
    """Fixed cases: a ratio above 1 + eps with A > 0 and one below 1 - eps with A < 0 take the
    clipped branch (no gradient); the opposite pairs keep the ratio."""
    eps = 0.2
    logp = torch.log(torch.tensor([1.5, 0.5, 1.5, 0.5, 1.1], dtype=torch.float64)).requires_grad_(True)
    old = torch.zeros(5, dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0, -1.0, 1.0, 1.0], dtype=torch.float64)
    pg, _, taken = grpo_token_terms(logp, old, None, adv, eps)
    pg.sum().backward()
    torch.testing.assert_close(pg, torch.tensor([-1.2, 0.8, 1.5, -0.5, -1.1], dtype=torch.float64))
    assert taken.tolist() == [True, True, False, False, False]
    torch.testing.assert_close(logp.grad, torch.tensor([0.0, 0.0, 1.5, -0.5, -1.1], dtype=torch.float64))


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from pcsd.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "m", hidden_size=64, num_layers=2, seed=3)


def _reference_epochs(model, frozen, rb, cfg, lr: float, clip: float) -> tuple[dict, list[float]]:
    """Two PPO epochs of plain GRPO (+ k3 KL) written out: log pi_old scored once before the first
    epoch, each epoch the loss on full-logit log-probs of the whole batch, its gradient, one SGD
    step. Returns the last epoch's gradients and the share of tokens clipped in each epoch."""
    from pcsd.ops.grpo import aggregate, group_advantages

    with torch.no_grad():
        old = plain_logprobs(model, rb.prompt_ids, rb.response_ids)
        ref = plain_logprobs(frozen, rb.prompt_ids, rb.response_ids)
    traj = rb.token_traj_ids()
    adv = group_advantages(rb.reward, rb.traj_group)[traj].float()
    mask = torch.ones_like(old, dtype=torch.bool)
    fracs = []
    for _ in range(2):
        model.zero_grad(set_to_none=True)
        lp = plain_logprobs(model, rb.prompt_ids, rb.response_ids)
        ratio = torch.exp(lp - old)
        unclipped, clipped = ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv
        pg = -torch.minimum(unclipped, clipped)
        d = ref - lp
        agg = cfg.algo.loss_agg
        loss = aggregate(pg, mask, traj, rb.num_trajectories, agg) + cfg.algo.kl_beta * aggregate(
            torch.exp(d) - d - 1, mask, traj, rb.num_trajectories, agg
        )
        loss.backward()
        fracs.append(float((clipped < unclipped).float().mean()))
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad
    return {n: p.grad.clone() for n, p in model.named_parameters()}, fracs


@pytest.mark.parametrize("fused", ["true", "false"])
def test_two_ppo_epochs_with_a_learning_rate_match_a_plain_reference(tiny_dir, fused):
    """optim.ppo_epochs=2, lr > 0: the first epoch moves the policy so far that in the second a
    good share of the ratios are outside [0.8, 1.2]; update_step's second-epoch gradients, final
    parameters and clip share equal the plain reference's, and a reference with a wider clip range
    (the mutant of issue 22) is measurably different, so this test catches it."""
    from pcsd.tiny_model import student_and_frozen, synthetic_rollout_batch
    from pcsd.train.update import update_step

    lr = 0.05  # the second epoch: ~35 % of the ratios outside [0.8, 1.2], most within [0.6, 1.4]
    cfg = load_config(
        [
            "method=grpo",
            "rollout.backend=hf",
            "optim.tokens_per_microbatch=60",
            "rollout.max_prompt_tokens=40",
            "rollout.max_response_tokens=20",
            "optim.grad_clip=1e9",
            "optim.ppo_epochs=2",
            f"optim.lr={lr}",
            "algo.kl_beta=0.01",
            f"optim.fused_lm_head={fused}",
        ]
    )
    student, frozen = student_and_frozen(tiny_dir)
    rb = synthetic_rollout_batch(num_groups=2, group_size=3, seed=5, turns=(1, 2))
    start = copy.deepcopy(student)
    stats = update_step(student, frozen, torch.optim.SGD(student.parameters(), lr=lr), rb, cfg, step=0)
    got = {n: p.grad.clone() for n, p in student.named_parameters()}

    ref_model = copy.deepcopy(start)
    want, fracs = _reference_epochs(ref_model, frozen, rb, cfg, lr, cfg.algo.clip_eps)
    assert fracs[0] == 0.0 and fracs[1] > 0.1, fracs  # the clip acts in the second epoch only
    assert stats["clip_frac"] == pytest.approx(fracs[1], abs=1e-6)
    for n, p in ref_model.named_parameters():
        torch.testing.assert_close(got[n], want[n], rtol=1e-3, atol=1e-6, msg=n)
        torch.testing.assert_close(
            dict(student.named_parameters())[n].detach(), p.detach(), rtol=1e-4, atol=1e-6, msg=n
        )
    wide, _ = _reference_epochs(copy.deepcopy(start), frozen, rb, cfg, lr, 2 * cfg.algo.clip_eps)
    assert max(float((wide[n] - want[n]).abs().max()) for n in want) > 100 * max(
        float((got[n] - want[n]).abs().max()) for n in want
    )


@pytest.mark.parametrize("value", ["0", "0.0", "-0.1", "-1"])
def test_clip_eps_needs_a_positive_value(value, capsys):
    """0 would freeze the ratio, a negative value inverts the clip range and silently removes the
    gradient of positive advantages: both refused in one line when the config is read."""
    with pytest.raises(ConfigError, match=r"algo\.clip_eps"):
        load_config([f"algo.clip_eps={value}"])
    from pcsd.train.cli import main

    assert main([f"algo.clip_eps={value}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "algo.clip_eps" in err and "Traceback" not in err
