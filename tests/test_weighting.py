"""The weighting-rule registry: every rule of the paper by name, each against its formula."""

from __future__ import annotations

import pytest
import torch

from pcsd.ops.kernels import pcsd_weights
from pcsd.ops.reference import pcsd_weights_reference
from pcsd.ops.weighting import available_rules, get_rule, rlsd_lambda

EXPECTED = {"pcsd", "pcsd-fixed-n1", "pcsd-fixed-n4", "pcsd-no-trend", "pcsd-no-decay",
            "uniform", "sdar", "rlsd", "skill-sd"}


def batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    gap = torch.randn(90, generator=g)
    cu = torch.tensor([0, 30, 31, 90])
    mask = torch.rand(90, generator=g) > 0.2
    return gap, cu, mask


def test_every_rule_of_the_paper_is_registered():
    assert EXPECTED <= set(available_rules())
    assert set(available_rules("advantage")) == {"rlsd"}
    assert set(available_rules("loss")) == {"skill-sd"}
    with pytest.raises(ValueError, match="unknown weighting rule 'nope'; valid: "):
        get_rule("nope")


@pytest.mark.parametrize("name, ref_kw", [
    ("pcsd", {}),
    ("pcsd-fixed-n1", dict(adaptive=False, n_min=1)),
    ("pcsd-fixed-n4", dict(adaptive=False, n_min=4)),
    ("pcsd-no-trend", dict(trend=False)),
    ("pcsd-no-decay", dict(alpha=1.0)),
])
def test_pcsd_variants_match_the_reference(name, ref_kw):
    gap, cu, mask = batch()
    got = get_rule(name)(gap, cu, mask)
    ref = pcsd_weights_reference(gap.double(), cu, mask, **ref_kw).w
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-6)


def test_ablations_differ_from_pcsd():
    gap, cu, mask = batch(1)
    full = get_rule("pcsd")(gap, cu, mask)
    for name in ("pcsd-fixed-n1", "pcsd-fixed-n4", "pcsd-no-trend", "pcsd-no-decay"):
        assert not torch.allclose(get_rule(name)(gap, cu, mask), full), name


def test_fixed_window_uses_decayed_mean_only():
    gap, cu, mask = batch(2)
    st = pcsd_weights(gap, cu, mask, adaptive=False, n_min=4, return_stats=True)
    assert bool((st.r == 0).all())
    # adaptive equals the decayed mean over 4 tokens inside the segment
    i = 5
    w = torch.tensor([0.8 ** j for j in range(4)]) * mask[i:i + 4]
    torch.testing.assert_close(st.adaptive[i], (w * gap[i:i + 4]).sum() / w.sum())


def test_uniform_is_the_gate_with_beta_zero():
    gap, cu, mask = batch(3)
    u = get_rule("uniform")(gap, cu, mask)
    torch.testing.assert_close(u, mask.float() * 0.5)
    gate0 = pcsd_weights(gap, cu, mask, beta_gate=0.0, trend=False)
    torch.testing.assert_close(u, gate0)
    torch.testing.assert_close(get_rule("uniform")(gap, cu, mask, constant=0.25), mask.float() * 0.25)


def test_sdar_is_pointwise_sigmoid():
    gap, cu, mask = batch(4)
    got = get_rule("sdar")(gap, cu, mask)
    torch.testing.assert_close(got, torch.sigmoid(5.0 * gap) * mask)
    with pytest.raises(ValueError, match="has no parameter"):
        get_rule("sdar")(gap, cu, mask, gamma=1.0)


def test_rlsd_advantage_transform():
    gap, cu, mask = batch(5)
    adv = torch.randn(90)
    got = get_rule("rlsd")(adv, gap, mask, 0)
    factor = torch.exp(torch.sign(adv) * gap).clamp(0.8, 1.2)
    torch.testing.assert_close(got, adv * (0.5 + 0.5 * factor) * mask)
    assert rlsd_lambda(50) == pytest.approx(0.25)
    assert rlsd_lambda(100) == 0.0 and rlsd_lambda(150) == 0.0
    torch.testing.assert_close(get_rule("rlsd")(adv, gap, mask, 100), adv * mask)
    with pytest.raises(ValueError, match="step must be >= 0"):
        get_rule("rlsd")(adv, gap, mask, -1)


def _skill_sd_literal(student, teacher, old, mask):
    """The Skill-SD loss token by token in plain Python floats: the SDAR code's formula read
    literally, then the token mean over the valid tokens."""
    import math

    total, n = 0.0, 0
    for s, t, o, m in zip(student, teacher, old, mask):
        if not m:
            continue
        ell = s - t
        k3 = math.exp(min(-ell, 20.0)) - 1.0 + ell
        rho = math.exp(min(s - o, 10.0))
        total += rho * k3
        n += 1
    return total / max(n, 1)


@pytest.mark.parametrize("scale", [0.5, 30.0], ids=["moderate", "clamped"])
def test_skill_sd_loss_and_gradient_match_a_literal_loop(scale):
    """skill-sd's token-mean loss and its gradient == a per-token Python loop (the gradient by
    central differences of the loop, token by token), the clamps included (scale 30 puts some
    -l above 20 and some ratios above e^10, where the gradient of the clamped factor is 0)."""
    from pcsd.ops.losses import skill_sd_loss

    g = torch.Generator().manual_seed(7)
    T = 40
    student = (torch.randn(T, generator=g, dtype=torch.float64) * scale).requires_grad_(True)
    teacher = torch.randn(T, generator=g, dtype=torch.float64) * scale
    old = student.detach() + torch.randn(T, generator=g, dtype=torch.float64) * scale * 0.5
    mask = torch.rand(T, generator=g) > 0.25
    rule = get_rule("skill-sd")
    per = rule(student, teacher, old, mask)
    loss = per.sum() / mask.sum()
    loss.backward()
    s, t, o, m = student.detach().tolist(), teacher.tolist(), old.tolist(), mask.tolist()
    want = _skill_sd_literal(s, t, o, m)
    assert float(loss.detach()) == pytest.approx(want, rel=1e-10, abs=1e-12)
    assert float(skill_sd_loss(student, teacher, old, mask).detach()) == pytest.approx(want, rel=1e-10, abs=1e-12)
    eps = 1e-6
    for i in range(T):
        hi, lo = list(s), list(s)
        hi[i] += eps
        lo[i] -= eps
        # the loop's old log-prob stays fixed (it is detached in the loss)
        num = (_skill_sd_literal(hi, t, o, m) - _skill_sd_literal(lo, t, o, m)) / (2 * eps)
        assert float(student.grad[i]) == pytest.approx(num, rel=1e-5, abs=1e-6 * max(1.0, abs(want))), i
    assert not per[~mask].any()  # masked tokens contribute nothing


def test_skill_sd_gradient_on_policy_is_the_signed_gap():
    """At pi = pi_old the Skill-SD pull d(-L_t)/d log pi is the gap log pi_teacher - log pi."""
    g = torch.Generator().manual_seed(1)
    lp = torch.randn(25, generator=g, dtype=torch.float64).requires_grad_(True)
    teacher = lp.detach() + torch.randn(25, generator=g, dtype=torch.float64)
    get_rule("skill-sd")(lp, teacher, lp.detach(), None).sum().backward()
    torch.testing.assert_close(-lp.grad, teacher - lp.detach())
