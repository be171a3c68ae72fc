"""GRPO against a literal loop over the paper's appendix equations."""

from __future__ import annotations

import math

import pytest
import torch

from pcsd.ops.grpo import aggregate, group_advantages, grpo_loss


def loop_advantages(rewards, groups, eps=1e-6):
    out = []
    for r, g in zip(rewards, groups):
        members = [x for x, gg in zip(rewards, groups) if gg == g]
        mu = sum(members) / len(members)
        sd = math.sqrt(sum((x - mu) ** 2 for x in members) / len(members))
        out.append((r - mu) / (sd + eps))
    return out


def loop_loss(logp, old, ref, adv_traj, mask, traj, num_traj, clip=0.2, beta=0.01):
    """-1/G sum_g 1/M_g sum_i m min(rho A, clip(rho) A) + beta/G sum_g 1/M_g sum_i m KL."""
    total = 0.0
    n_with_tokens = 0
    for g in range(num_traj):
        idx = [i for i in range(len(logp)) if traj[i] == g and mask[i]]
        if not idx:
            continue
        n_with_tokens += 1
        pol = 0.0
        kl = 0.0
        for i in idx:
            rho = torch.exp(logp[i] - old[i])
            a = adv_traj[g]
            pol = pol + torch.minimum(rho * a, rho.clamp(1 - clip, 1 + clip) * a)
            d = ref[i] - logp[i]
            kl = kl + torch.exp(d) - d - 1
        total = total + (-pol + beta * kl) / len(idx)
    return total / n_with_tokens


def test_group_advantages_population_std():
    rewards = torch.tensor([10.0, 0.0, 0.0, 10.0, 0.0, 0.0, 0.0, 0.0, 10.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 2])
    got = group_advantages(rewards, groups)
    exp = loop_advantages(rewards.tolist(), groups.tolist())
    torch.testing.assert_close(got, torch.tensor(exp), rtol=1e-6, atol=1e-6)
    assert float(got[4]) == 0.0 and float(got[8]) == 0.0  # identical rewards: zero advantage
    assert float(got[0]) == pytest.approx(1.0, abs=1e-5)  # (10-5)/5


def test_loss_matches_loop_and_gradients_match_autograd():
    torch.manual_seed(0)
    T, G = 40, 5
    traj = torch.randint(0, G, (T,)).sort().values
    mask = torch.rand(T) > 0.2
    old = torch.randn(T, dtype=torch.float64) * 0.3 - 1
    ref = old + torch.randn(T, dtype=torch.float64) * 0.1
    base = old + torch.randn(T, dtype=torch.float64) * 0.3
    adv_traj = torch.randn(G, dtype=torch.float64)
    logp = base.clone().requires_grad_()
    terms = grpo_loss(logp, old, ref, adv_traj[traj], mask, traj, G)
    logp2 = base.clone().requires_grad_()
    expected = loop_loss(logp2, old, ref, adv_traj, mask.tolist(), traj.tolist(), G)
    torch.testing.assert_close(terms.loss, expected, rtol=1e-10, atol=1e-12)
    terms.loss.backward()
    expected.backward()
    torch.testing.assert_close(logp.grad, logp2.grad, rtol=1e-10, atol=1e-12)
    assert 0 < float(terms.clip_frac) < 1


def test_aggregation_modes():
    x = torch.tensor([1.0, 2.0, 3.0, 10.0])
    m = torch.tensor([1.0, 1.0, 1.0, 1.0])
    traj = torch.tensor([0, 0, 0, 1])
    assert float(aggregate(x, m, traj, 2, "seq-mean-token-mean")) == pytest.approx((2.0 + 10.0) / 2)
    assert float(aggregate(x, m, traj, 2, "token-mean")) == pytest.approx(16.0 / 4)
    assert float(aggregate(x, m, traj, 2, "seq-mean-token-sum")) == pytest.approx((6.0 + 10.0) / 2)
    with pytest.raises(ValueError, match="unknown loss aggregation 'x'; valid"):
        aggregate(x, m, traj, 2, "x")


def test_on_policy_ratio_one_gives_minus_advantage_mean():
    T = 6
    logp = torch.zeros(T, requires_grad=True)
    adv = torch.tensor([1.0, 1.0, 1.0, -2.0, -2.0, -2.0])
    traj = torch.tensor([0, 0, 0, 1, 1, 1])
    t = grpo_loss(logp, logp.detach(), None, adv, torch.ones(T), traj, 2, kl_beta=0.0)
    assert float(t.loss) == pytest.approx(0.5)  # -(1 + -2)/2
    assert float(t.clip_frac) == 0.0 and float(t.ratio_mean) == 1.0


@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "token-mean", "seq-mean-token-sum"])
def test_token_coefficients_reproduce_aggregation(mode):
    from pcsd.ops.grpo import token_coefficients

    torch.manual_seed(1)
    x = torch.randn(30, dtype=torch.float64)
    traj = torch.randint(0, 6, (30,))
    m = torch.rand(30) > 0.3
    c = token_coefficients(m, traj, 7, mode)
    torch.testing.assert_close((c * x).sum(), aggregate(x, m.double(), traj, 7, mode))


# ----------------------------------------------------------------------------- the update's per-token loss
def _token_terms(n_turns=(5, 1, 7), seed=0, ref=True):
    from pcsd.ops.losses import TokenTerms, pcsd_token_loss

    g = torch.Generator().manual_seed(seed)
    n = sum(n_turns)
    traj = torch.repeat_interleave(torch.arange(len(n_turns)), torch.tensor(n_turns))
    mask = torch.rand(n, generator=g) > 0.2
    old = torch.randn(n, generator=g, dtype=torch.float64) - 2
    teacher = torch.randn(n, generator=g, dtype=torch.float64) - 2
    segs = [0]
    for x in n_turns:
        segs.append(segs[-1] + x)
    return TokenTerms(
        old_logp=old,
        advantages=torch.randn(n, generator=g, dtype=torch.float64),
        coef=torch.rand(n, generator=g, dtype=torch.float64) * mask,
        mask=mask,
        traj_ids=traj,
        segments=tuple(segs),
        gap=teacher - old,
        ref_logp=(torch.randn(n, generator=g, dtype=torch.float64) - 2) if ref else None,
        teacher_logp=teacher,
        weights=torch.rand(n, generator=g, dtype=torch.float64) * mask,
        rule_loss=lambda lp, t: pcsd_token_loss(lp, t.teacher_logp, t.weights, t.mask),
    )


@pytest.mark.parametrize("grpo, ref", [(True, True), (False, True), (True, False)])
def test_update_token_loss_is_the_sum_of_its_terms_written_out(grpo, ref):
    """update_token_loss (both paths of the update) against the terms written out per token:
    c (-min(rho A, clip(rho) A)) + kl_beta c k3 + lambda m w (teacher - lp) / M."""
    from pcsd.ops.losses import LossSpec, update_token_loss
    from pcsd.ops.policy_losses import get_policy_loss

    t = _token_terms(ref=ref)
    lp = t.old_logp + 0.3 * torch.randn(len(t.mask), generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    spec = LossSpec(get_policy_loss("ppo") if grpo else None, {"clip_eps": 0.2}, 0.1, 0.5, 11.0)
    parts = update_token_loss(lp, t, spec)
    for i in range(len(lp)):
        rho = math.exp(float(lp[i] - t.old_logp[i]))
        a, c = float(t.advantages[i]), float(t.coef[i])
        pg = -min(rho * a, min(max(rho, 0.8), 1.2) * a) if grpo else 0.0
        kl = 0.0
        if ref:
            d = float(t.ref_logp[i] - lp[i])
            kl = math.exp(d) - d - 1
        m, w = float(t.mask[i]), float(t.weights[i])
        distill = m * w * float(t.teacher_logp[i] - lp[i])  # the rule's term; it enters / M (11)
        assert float(parts.pg[i]) == pytest.approx(c * pg, rel=1e-12, abs=1e-15)
        assert float(parts.kl[i]) == pytest.approx(c * kl, rel=1e-12, abs=1e-15)
        assert float(parts.distill[i]) == pytest.approx(distill, rel=1e-12, abs=1e-15)
        want = c * pg + 0.1 * c * kl + 0.5 * distill / 11.0
        assert float(parts.total[i]) == pytest.approx(want, rel=1e-12, abs=1e-15)
    assert bool(parts.clipped.any()) == grpo  # ratios up to exp(+-0.9): some clipped


def test_policy_losses_are_chosen_by_name():
    from pcsd.ops.grpo import grpo_token_terms
    from pcsd.ops.policy_losses import available_policy_losses, get_policy_loss, register_policy_loss

    assert "ppo" in available_policy_losses()
    t = _token_terms(seed=3)
    lp = t.old_logp + 0.25
    pg, clipped = get_policy_loss("ppo")(lp, t, {"clip_eps": 0.1})
    want_pg, _, want_clipped = grpo_token_terms(lp, t.old_logp, None, t.advantages, 0.1)
    # a masked token is never counted as clipped (its coefficient is 0: it is not in the term)
    assert torch.equal(pg, want_pg) and torch.equal(clipped, want_clipped & t.mask)
    with pytest.raises(ValueError, match=r"unknown policy loss 'cispo'; valid: \['ppo', 'gspo'"):
        get_policy_loss("cispo")
    with pytest.raises(ValueError, match="already registered"):
        register_policy_loss("ppo")(lambda lp, t, algo: (lp, lp > 0))
