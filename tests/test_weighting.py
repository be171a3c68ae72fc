"""The weighting-rule registry: every rule of the paper by name, each against its formula."""

from __future__ import annotations

import pytest
import torch

from pcsd.ops.kernels import pcsd_weights
from pcsd.ops.reference import pcsd_weights_reference
from pcsd.ops.weighting import available_rules, get_rule, rlsd_lambda

EXPECTED = {"pcsd", "pcsd-fixed-n1", "pcsd-fixed-n4", "pcsd-no-trend", "pcsd-no-decay",
            "uniform", "sdar", "rlsd"}


def batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    gap = torch.randn(90, generator=g)
    cu = torch.tensor([0, 30, 31, 90])
    mask = torch.rand(90, generator=g) > 0.2
    return gap, cu, mask


def test_every_rule_of_the_paper_is_registered():
    assert EXPECTED <= set(available_rules())
    assert set(available_rules("advantage")) == {"rlsd"}
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
