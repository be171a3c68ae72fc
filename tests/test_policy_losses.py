"""The policy losses (pcsd.ops.policy_losses) against values worked out by hand from the public
formulas (PPO's clipped ratio with DAPO's asymmetric clip, verl's GSPO), over several PPO epochs, and
packed against verl's padded [B, L] form."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import NamedTuple

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pcsd.ops.grpo import ppo_clip_terms
from pcsd.ops.losses import TokenTerms
from pcsd.ops.policy_losses import available_policy_losses, get_policy_loss, gspo_clip_terms, gspo_ratio


class Out(NamedTuple):
    pg: torch.Tensor
    clipped: torch.Tensor
    ratio: torch.Tensor


def PPO(lp, old, adv, cu, mask, *, clip_low, clip_high):
    """The ppo term on packed tokens (masked tokens zeroed, as the update's coefficients do)."""
    pg, clipped = ppo_clip_terms(lp, old, adv, clip_low, clip_high)
    m = mask.to(torch.bool)
    return Out(torch.where(m, pg, torch.zeros_like(pg)), clipped & m, torch.exp(lp - old).detach())


def GSPO(lp, old, adv, cu, mask, *, clip_low, clip_high):
    pg, clipped = gspo_clip_terms(lp, old, adv, cu, mask, clip_low, clip_high)
    return Out(pg, clipped, gspo_ratio(lp, old, cu, mask).detach())


def terms(old, adv, cu, mask=None) -> TokenTerms:
    n = old.numel()
    return TokenTerms(
        old_logp=old,
        advantages=adv,
        coef=torch.ones(n),
        mask=torch.ones(n, dtype=torch.bool) if mask is None else mask,
        traj_ids=torch.zeros(n, dtype=torch.int64),
        segments=tuple(cu.tolist()),
        gap=torch.zeros(n),
    )


def cu_(*lengths: int) -> torch.Tensor:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return torch.tensor(out)


def test_registry_and_the_update_s_signature():
    assert available_policy_losses()[:2] == ["ppo", "gspo"]
    with pytest.raises(ValueError, match="unknown policy loss 'cispo'.*ppo"):
        get_policy_loss("cispo")
    torch.manual_seed(0)
    old = torch.randn(7) - 1
    lp = old + torch.randn(7) * 0.3
    adv, cu = torch.randn(7), cu_(3, 4)
    t = terms(old, adv, cu)
    for name, fn in (("ppo", PPO), ("gspo", GSPO)):
        for algo in (
            {"clip_eps": 0.2},
            {"clip_eps": 0.2, "clip_eps_high": None},
            {"clip_eps": 0.2, "clip_eps_high": 0.28},
        ):
            high = algo.get("clip_eps_high") or 0.2
            pg, clipped = get_policy_loss(name)(lp, t, algo)
            ref = fn(lp, old, adv, cu, torch.ones(7), clip_low=0.2, clip_high=high)
            assert torch.equal(pg, ref.pg) and torch.equal(clipped, ref.clipped), (name, algo)
    with pytest.raises(ValueError, match="cu_seqlens must be 1-D offsets from 0 to T=7"):
        gspo_clip_terms(lp, old, adv, cu_(3), torch.ones(7))


def test_ppo_without_an_upper_clip_is_symmetric():
    torch.manual_seed(0)
    old = torch.randn(50) * 0.5 - 1
    lp = (old + torch.randn(50) * 0.3).requires_grad_()
    adv = torch.randn(50)
    a = ppo_clip_terms(lp, old, adv, 0.2)
    b = ppo_clip_terms(lp, old, adv, 0.2, 0.2)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_ppo_asymmetric_clip_by_hand():
    """clip [1 - 0.2, 1 + 0.28]: ratio above and below 1, advantages of both signs."""
    ratios = [1.25, 1.35, 0.75, 0.75, 1.35, 1.0]
    adv = torch.tensor([1.0, 1.0, -1.0, 1.0, -1.0, 2.0])
    old = torch.zeros(6)
    lp = torch.tensor([math.log(r) for r in ratios], requires_grad=True)
    out = PPO(lp, old, adv, cu_(6), torch.ones(6), clip_low=0.2, clip_high=0.28)
    # -min(rho A, clip(rho) A): 1.25 inside the clip; 1.35 A>0 clipped at 1.28; 0.75 A<0 clipped at 0.8;
    # 0.75 A>0 and 1.35 A<0 keep the (pessimistic) unclipped value; ratio 1: -A
    exp = [-1.25, -1.28, 0.8, -0.75, 1.35, -2.0]
    torch.testing.assert_close(out.pg, torch.tensor(exp))
    assert out.clipped.tolist() == [False, True, True, False, False, False]
    out.pg.sum().backward()
    # d/dlogp of -rho A = -rho A where unclipped, 0 where clipped
    torch.testing.assert_close(lp.grad, torch.tensor([-1.25, 0.0, 0.0, -0.75, 1.35, -2.0]))
    # with the symmetric clip (0.2) the first token, ratio 1.25, is clipped too
    sym = PPO(lp.detach(), old, adv, cu_(6), torch.ones(6), clip_low=0.2, clip_high=0.2)
    assert sym.clipped.tolist()[:2] == [True, True] and float(sym.pg[0]) == pytest.approx(-1.2)


def run_epochs(adv: float, clip_high: float, epochs: int = 6, lr: float = 0.1) -> list[float]:
    """Several PPO epochs on one token whose log-prob is the parameter theta (log pi_old = 0): SGD on
    the ppo loss; returns theta after each epoch."""
    theta = torch.zeros(1, requires_grad=True)
    out = []
    for _ in range(epochs):
        out_ = PPO(theta, torch.zeros(1), torch.tensor([adv]), cu_(1), torch.ones(1), clip_low=0.2, clip_high=clip_high)
        (g,) = torch.autograd.grad(out_.pg.sum(), theta)
        with torch.no_grad():
            theta -= lr * g
        out.append(float(theta.detach()))
    return out


def test_several_ppo_epochs_stop_at_the_upper_clip():
    """A > 0: theta_{k+1} = theta_k + 0.1 exp(theta_k) while exp(theta_k) < 1 + clip_high, then the
    gradient is 0. By hand: 0 -> 0.1 (ratio 1.10517) -> 0.210517 (ratio 1.23431) -> 0.333948 (ratio 1.39648)."""
    t1 = 0.1
    t2 = t1 + 0.1 * math.exp(t1)
    t3 = t2 + 0.1 * math.exp(t2)
    # symmetric 0.2: ratio 1.23431 >= 1.2 after two epochs, the rest change nothing
    assert run_epochs(1.0, 0.2) == pytest.approx([t1, t2, t2, t2, t2, t2], abs=1e-6)
    # DAPO's 0.28: one more epoch moves (1.23431 < 1.28), then ratio 1.39648 >= 1.28 stops it
    assert run_epochs(1.0, 0.28) == pytest.approx([t1, t2, t3, t3, t3, t3], abs=1e-6)


def test_several_ppo_epochs_stop_at_the_lower_clip_whatever_the_upper():
    """A < 0: theta_{k+1} = theta_k - 0.1 exp(theta_k) while exp(theta_k) > 0.8:
    0 -> -0.1 (0.904837) -> -0.190484 (0.826565) -> -0.273140 (0.760951), then 0."""
    t1 = -0.1
    t2 = t1 - 0.1 * math.exp(t1)
    t3 = t2 - 0.1 * math.exp(t2)
    exp = [t1, t2, t3, t3, t3, t3]
    assert run_epochs(-1.0, 0.2) == pytest.approx(exp, abs=1e-6)
    assert run_epochs(-1.0, 0.28) == pytest.approx(exp, abs=1e-6)


def test_gspo_by_hand():
    """Two turns: tokens 0-2 (log-ratios 0.3, -0.1, 0.1: mean 0.1) and 3-4 (0.5, 0.5: mean 0.5, clipped)."""
    old = torch.tensor([-1.0, -2.0, -0.5, -1.0, -1.5])
    delta = torch.tensor([0.3, -0.1, 0.1, 0.5, 0.5])
    lp = (old + delta).requires_grad_()
    adv = torch.tensor([2.0, 2.0, 2.0, 1.0, 1.0])
    out = GSPO(lp, old, adv, cu_(3, 2), torch.ones(5), clip_low=0.2, clip_high=0.28)
    s1, s2 = math.exp(0.1), math.exp(0.5)  # 1.10517 inside the clip; 1.64872 above 1.28
    torch.testing.assert_close(out.ratio, torch.tensor([s1, s1, s1, s2, s2]))
    # max(-A s, -A clip(s)): turn 1 -2 s1; turn 2 -min(s2, 1.28) = -1.28
    torch.testing.assert_close(out.pg, torch.tensor([-2 * s1] * 3 + [-1.28] * 2))
    assert out.clipped.tolist() == [False, False, False, True, True]
    out.pg.sum().backward()
    # each token of an unclipped turn: d/dlogp_t = -A s (its turn's ratio); clipped turn: 0
    torch.testing.assert_close(lp.grad, torch.tensor([-2 * s1] * 3 + [0.0, 0.0]))


def test_gspo_negative_advantage_and_lower_clip():
    old = torch.zeros(2)
    lp = torch.tensor([-0.4, -0.2], requires_grad=True)  # mean -0.3: s = 0.740818 < 0.8
    out = GSPO(lp, old, torch.tensor([-1.0, -1.0]), cu_(2), torch.ones(2), clip_low=0.2, clip_high=0.28)
    # max(s, clip(s)) = 0.8, clipped: no gradient
    torch.testing.assert_close(out.pg, torch.tensor([0.8, 0.8]))
    assert out.clipped.all()
    out.pg.sum().backward()
    assert lp.grad.abs().max() == 0


def test_gspo_log_ratio_clamped_at_10():
    out = GSPO(
        torch.tensor([12.0]), torch.zeros(1), torch.tensor([-1.0]), cu_(1), torch.ones(1), clip_low=0.2, clip_high=0.2
    )
    assert float(out.ratio[0]) == pytest.approx(math.exp(10.0))


def test_gspo_with_one_token_turns_is_ppo():
    torch.manual_seed(1)
    old = torch.randn(12) - 1
    lp = old + torch.randn(12) * 0.4
    adv = torch.randn(12)
    kw = dict(clip_low=0.2, clip_high=0.28)
    a = GSPO(lp, old, adv, cu_(*[1] * 12), torch.ones(12), **kw)
    b = PPO(lp, old, adv, cu_(12), torch.ones(12), **kw)
    torch.testing.assert_close(a.pg, b.pg)
    assert torch.equal(a.clipped, b.clipped)


@pytest.mark.parametrize("loss", ["ppo", "gspo"])
def test_padding_tokens_add_nothing(loss):
    """Through the update's per-token loss: masked tokens (coefficient 0, as the update gives them)
    add nothing and get no gradient, and GSPO's turn ratio is the mean over its turn's valid tokens."""
    from pcsd.ops.losses import LossSpec, update_token_loss

    old = torch.tensor([-1.0, -1.0, -1.0, -1.0])
    lp = torch.tensor([-0.8, 5.0, -1.2, 7.0], requires_grad=True)  # tokens 1 and 3 are padding
    mask = torch.tensor([True, False, True, False])
    t = replace(terms(old, torch.ones(4), cu_(2, 2), mask), coef=mask.float())
    spec = LossSpec(get_policy_loss(loss), {"clip_eps": 0.2, "clip_eps_high": 0.28}, 0.0, 0.0, 2.0)
    parts = update_token_loss(lp, t, spec)
    assert parts.pg[1] == 0 and parts.pg[3] == 0 and not parts.clipped[1] and not parts.clipped[3]
    parts.total.sum().backward()
    assert lp.grad[1] == 0 and lp.grad[3] == 0 and lp.grad[0] != 0
    if loss == "gspo":
        s = gspo_ratio(lp.detach(), old, cu_(2, 2), mask)
        torch.testing.assert_close(s[[0, 2]], torch.tensor([math.exp(0.2), math.exp(-0.2)]))


# ----------------------------------------------------------------------------- packed vs verl's padded form
def verl_gspo_padded(old, lp, adv, mask, low, high):
    """verl's compute_policy_loss_gspo's per-token losses on [B, L] tensors (before aggregation)."""
    neg_kl = lp - old
    seq_len = mask.sum(-1).clamp(min=1)
    seq = (neg_kl * mask).sum(-1) / seq_len
    log_s = (lp - lp.detach() + seq.detach().unsqueeze(-1)).clamp(max=10.0)
    s = torch.exp(log_s)
    return torch.maximum(-adv * s, -adv * s.clamp(1 - low, 1 + high))


@settings(max_examples=50, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 6), min_size=1, max_size=5),
    seed=st.integers(0, 2**16),
    high=st.sampled_from([0.2, 0.28, 0.5]),
)
def test_gspo_packed_equals_padded(lengths, seed, high):
    g = torch.Generator().manual_seed(seed)
    B, L = len(lengths), max(lengths)
    old = torch.randn(B, L, generator=g, dtype=torch.float64) - 1
    lp = (old + torch.randn(B, L, generator=g, dtype=torch.float64) * 0.3).requires_grad_()
    adv = torch.randn(B, 1, generator=g, dtype=torch.float64).expand(B, L)
    mask = (torch.arange(L)[None] < torch.tensor(lengths)[:, None]).to(torch.float64)
    pad = verl_gspo_padded(old, lp, adv, mask, 0.2, high)
    (pad * mask).sum().backward()
    grad_pad = lp.grad.clone()
    lp2 = lp.detach()[mask.bool()].clone().requires_grad_()
    out = GSPO(
        lp2, old[mask.bool()], adv[mask.bool()], cu_(*lengths), torch.ones(lp2.numel()), clip_low=0.2, clip_high=high
    )
    torch.testing.assert_close(out.pg, pad[mask.bool()])
    out.pg.sum().backward()
    torch.testing.assert_close(lp2.grad, grad_pad[mask.bool()])
