"""The weighting-rule registry: every rule of the paper by name, each against its formula."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pcsd.ops.kernels import pcsd_weights
from pcsd.ops.reference import pcsd_weights_reference
from pcsd.ops.weighting import available_rules, get_rule, rlsd_lambda

EXPECTED = {
    "pcsd",
    "pcsd-fixed-n1",
    "pcsd-fixed-n4",
    "pcsd-no-trend",
    "pcsd-no-decay",
    "uniform",
    "sdar",
    "sdar-norm",
    "rlsd",
    "skill-sd",
}


def batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    gap = torch.randn(90, generator=g)
    cu = torch.tensor([0, 30, 31, 90])
    mask = torch.rand(90, generator=g) > 0.2
    return gap, cu, mask


def test_every_rule_of_the_paper_is_registered():
    assert EXPECTED <= set(available_rules())
    assert set(available_rules("advantage")) == {"rlsd"}
    assert set(available_rules("loss")) == {"skill-sd", "sdpo"}
    assert set(available_rules("batch")) == {"agentopsd"}
    with pytest.raises(ValueError, match="unknown weighting rule 'nope'; valid: "):
        get_rule("nope")


@pytest.mark.parametrize(
    "name, ref_kw",
    [
        ("pcsd", {}),
        ("pcsd-fixed-n1", dict(adaptive=False, n_min=1)),
        ("pcsd-fixed-n4", dict(adaptive=False, n_min=4)),
        ("pcsd-no-trend", dict(trend=False)),
        ("pcsd-no-decay", dict(alpha=1.0)),
    ],
)
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
    w = torch.tensor([0.8**j for j in range(4)]) * mask[i : i + 4]
    torch.testing.assert_close(st.adaptive[i], (w * gap[i : i + 4]).sum() / w.sum())


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
    torch.testing.assert_close(get_rule("sdar")(gap, cu, mask, beta_gate=2.0), torch.sigmoid(2.0 * gap) * mask)
    with pytest.raises(ValueError, match="has no parameter"):
        get_rule("sdar")(gap, cu, mask, gamma=1.0)
    with pytest.raises(ValueError, match="beta_gate must be >= 0"):
        get_rule("sdar")(gap, cu, mask, beta_gate=-1.0)


def _sdar_norm_loop(gap, cu, mask, beta_gate=5.0):
    """The normalised SDAR weights in Python floats: per response, each valid token's gate over the
    mean gate of the response's valid tokens."""
    import math

    out = [0.0] * len(gap)
    for a, b in zip(cu[:-1], cu[1:]):
        valid = [i for i in range(a, b) if mask[i]]
        gates = {i: 1.0 / (1.0 + math.exp(-beta_gate * gap[i])) for i in valid}
        mean = sum(gates.values()) / len(valid) if valid else 1.0
        for i in valid:
            out[i] = gates[i] / mean
    return out


@settings(max_examples=50, deadline=None)
@given(
    lens=st.lists(st.integers(0, 12), min_size=1, max_size=8),
    seed=st.integers(0, 2**31 - 1),
    beta=st.sampled_from([0.0, 1.0, 5.0, 20.0]),
    keep=st.floats(0.0, 1.0),
)
@example(lens=[1, 1], seed=0, beta=20.0, keep=1.0)  # a gate of ~1e-5 after one of ~1: no prefix-sum cancellation
def test_sdar_norm_matches_a_loop(lens, seed, beta, keep):
    """Segments of any length (empty ones, ones with no valid token included), any mask."""
    g = torch.Generator().manual_seed(seed)
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    gap = torch.randn(cu[-1], generator=g, dtype=torch.float64) * 2
    mask = torch.rand(cu[-1], generator=g) < keep
    got = get_rule("sdar-norm")(gap, torch.tensor(cu), mask, beta_gate=beta)
    want = _sdar_norm_loop(gap.tolist(), cu, mask.tolist(), beta)
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=1e-12)


def test_sdar_norm_weights_compete_within_a_response_only():
    """Each response's weights average 1 over its valid tokens; raising one token's gap raises its
    weight and lowers every other weight of its response, and leaves other responses alone."""
    gap, cu, mask = batch(6)
    rule = get_rule("sdar-norm")
    w = rule(gap, cu, mask)
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        m = mask[a:b]
        if m.any():
            assert float(w[a:b][m].mean()) == pytest.approx(1.0, rel=1e-6)
    assert not w[~mask].any()
    i = int(torch.nonzero(mask[31:90])[0]) + 31  # a valid token of the third response
    bumped = gap.clone()
    bumped[i] += 2.0
    w2 = rule(bumped, cu, mask)
    assert float(w2[i]) > float(w[i])
    others = mask.clone()
    others[i] = False
    others[:31] = False
    assert bool((w2[others] < w[others]).all())
    torch.testing.assert_close(w2[:31], w[:31])
    # sdar stays pointwise: the other tokens' weights do not move
    s1, s2 = get_rule("sdar")(gap, cu, mask), get_rule("sdar")(bumped, cu, mask)
    torch.testing.assert_close(s1[others], s2[others])


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


# ----------------------------------------------------------------------------- the one interface
def _terms(seed=0, n_turns=(30, 1, 59)):
    from pcsd.ops.losses import TokenTerms

    g = torch.Generator().manual_seed(seed)
    n = sum(n_turns)
    segs = [0]
    for x in n_turns:
        segs.append(segs[-1] + x)
    old = torch.randn(n, generator=g) - 3
    teacher = torch.randn(n, generator=g) - 3
    return TokenTerms(
        old_logp=old,
        advantages=torch.randn(n, generator=g),
        coef=torch.rand(n, generator=g),
        mask=torch.rand(n, generator=g) > 0.2,
        traj_ids=torch.repeat_interleave(torch.arange(len(n_turns)), torch.tensor(n_turns)),
        segments=tuple(segs),
        gap=teacher - old,
        ref_logp=torch.randn(n, generator=g) - 3,
        teacher_logp=teacher,
    )


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_rule_gives_its_terms_through_one_method(name):
    """WeightRule.terms (what the update calls) gives each kind's contribution: a weights rule its
    weights and the weighted loss term, an advantage rule the transformed advantages, a loss rule
    its own per-token term; whatever a rule does not give, the terms keep."""
    from pcsd.ops.losses import pcsd_token_loss

    rule, t = get_rule(name), _terms()
    r = rule.terms(t, 4)
    lp = (t.old_logp + 0.1).requires_grad_(True)
    if rule.kind == "weights":
        w = rule(t.gap, t.cu_seqlens, t.mask)
        torch.testing.assert_close(r.weights, w, rtol=0, atol=0)
        assert r.advantages is t.advantages
        with_w = dataclasses.replace(t, weights=r.weights)
        torch.testing.assert_close(r.loss(lp, with_w), pcsd_token_loss(lp, t.teacher_logp, w, t.mask))
    elif rule.kind == "advantage":
        torch.testing.assert_close(r.advantages, rule(t.advantages, t.gap, t.mask, 4))
        assert r.weights is None and r.loss is None
    else:
        torch.testing.assert_close(r.loss(lp, t), rule(lp, t.teacher_logp, t.old_logp, t.mask))
        assert r.weights is None and r.advantages is t.advantages
    assert rule.needs_teacher


def test_a_rule_reads_its_parameters_and_refuses_others():
    t = _terms(1)
    a = get_rule("sdar").terms(t, 1, beta_gate=2.0).weights
    torch.testing.assert_close(a, torch.sigmoid(2.0 * t.gap) * t.mask)
    with pytest.raises(ValueError, match=r"rule 'sdar' has no parameter\(s\) \['gamma'\]"):
        get_rule("sdar").terms(t, 1, gamma=1.0)
    assert get_rule("sdar").params_from({"beta_gate": 3.0, "gamma": 0.1, "n_min": 2}) == {"beta_gate": 3.0}
    assert get_rule("uniform").params_from({"beta_gate": 3.0}) == {}


def test_distill_false_turns_a_distillation_rule_off_but_not_an_advantage_transform():
    from pcsd.ops.weighting import NO_RULE, active_rule

    for name in ("pcsd", "sdar", "uniform", "skill-sd"):
        assert active_rule(name, True) is get_rule(name)
        assert active_rule(name, False) is NO_RULE
    assert active_rule("rlsd", False) is get_rule("rlsd") and not get_rule("rlsd").distills
    t = _terms(2)
    r = NO_RULE.terms(t, 1)
    assert r.advantages is t.advantages and r.weights is None and r.loss is None
    assert not NO_RULE.needs_teacher and "none" not in available_rules()
    with pytest.raises(ValueError, match="unknown weighting rule 'nope'"):
        active_rule("nope", False)


def test_a_terms_rule_is_one_function_and_a_registration():
    from pcsd.ops import weighting
    from pcsd.ops.weighting import RuleTerms, register_rule

    @register_rule("test-halve", "terms", scale=0.5, needs_teacher=False)
    def _halve(t, step, *, scale):
        return RuleTerms(t.advantages * scale * step)

    try:
        rule = get_rule("test-halve")
        assert rule.distills and not rule.needs_teacher and rule.defaults == {"scale": 0.5}
        t = _terms(3)
        torch.testing.assert_close(rule.terms(t, 2).advantages, t.advantages)
        torch.testing.assert_close(rule.terms(t, 1, scale=3.0).advantages, 3.0 * t.advantages)
        with pytest.raises(ValueError, match="already registered"):
            register_rule("test-halve", "terms")(_halve)
    finally:
        weighting._RULES.pop("test-halve", None)
    with pytest.raises(ValueError, match="kind must be one of"):
        register_rule("test-bad", "weight")


def test_token_terms_slice_at_turn_boundaries_only():
    t = _terms(4)
    s = t.slice(30, 31)
    assert s.segments == (0, 1) and s.old_logp.shape == (1,) and float(s.gap[0]) == float(t.gap[30])
    whole = t.slice(0, 90)
    assert whole.segments == t.segments and torch.equal(whole.cu_seqlens, torch.tensor([0, 30, 31, 90]))
    with pytest.raises(ValueError, match="turn boundaries"):
        t.slice(0, 10)
