"""GRPO as in the paper's appendix ("GRPO Objective"), as pure functions registered by name.

Token tensors are packed: every response turn of every trajectory back to back, ``[T]``, with
``traj_ids`` ``[T]`` naming each token's trajectory. A trajectory's tokens are all its turns'
response tokens, so ``M_g = sum_i m_{g,i}`` counts them across turns.

* advantage: ``A_g = (R_g - mu_R) / (sigma_R + eps)`` with the *population* std over the G
  trajectories of a group, shared by every token of every turn of the trajectory;
* ratio ``rho = exp(logp - logp_old)``, clipped to ``[1 - eps_clip, 1 + eps_clip]``;
* k3 KL to the frozen reference: ``exp(Delta) - Delta - 1`` with ``Delta = logp_ref - logp``;
* loss ``-1/G sum_g 1/M_g sum_i m min(rho A, clip(rho) A) + beta/G sum_g 1/M_g sum_i m KL``.

Loss aggregation is a named mode (verl's ``agg_loss`` modes): ``seq-mean-token-mean`` (the
paper: token mean within a trajectory, then mean over trajectories), ``token-mean`` (verl-agent's
default: mean over all valid tokens of the batch), ``seq-mean-token-sum``.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import torch
from torch import Tensor

from pcsd.ops.segments import segment_sum

__all__ = [
    "group_advantages",
    "aggregate",
    "grpo_loss",
    "GrpoTerms",
    "LOSS_AGG_MODES",
    "token_coefficients",
    "ppo_clip_terms",
    "k3_kl",
    "grpo_token_terms",
]


def group_advantages(rewards: Tensor, group_ids: Tensor, eps: float = 1e-6) -> Tensor:
    """``(R - mean_group) / (std_group + eps)`` per trajectory, population std. ``[N]`` -> ``[N]``."""
    if rewards.shape != group_ids.shape or rewards.dim() != 1:
        raise ValueError(
            f"rewards and group_ids must be 1-D of one shape, got {tuple(rewards.shape)} and {tuple(group_ids.shape)}"
        )
    r = rewards.to(torch.float64)
    _, inv = torch.unique(group_ids, return_inverse=True)
    g = int(inv.max()) + 1 if inv.numel() else 0
    # deterministic sums (pcsd.ops.segments): index_add_ on CUDA adds in thread order, so the
    # advantages, and a resumed run, would differ in their last bits from call to call
    cnt = torch.bincount(inv, minlength=g).to(torch.float64)
    mean = segment_sum(r, inv, g) / cnt
    dev = r - mean[inv]
    var = segment_sum(dev * dev, inv, g) / cnt
    return (dev / (var.sqrt()[inv] + eps)).to(rewards.dtype if rewards.is_floating_point() else torch.float32)


def _seq_sums(x: Tensor, m: Tensor, traj_ids: Tensor, num_traj: int) -> tuple[Tensor, Tensor]:
    return segment_sum(x * m, traj_ids, num_traj), segment_sum(m, traj_ids, num_traj)


def _agg_seq_mean_token_mean(x: Tensor, m: Tensor, traj_ids: Tensor, num_traj: int) -> Tensor:
    s, c = _seq_sums(x, m, traj_ids, num_traj)
    has = c > 0
    per = s[has] / c[has]
    return per.mean() if per.numel() else x.sum() * 0.0


def _agg_token_mean(x: Tensor, m: Tensor, traj_ids: Tensor, num_traj: int) -> Tensor:
    return (x * m).sum() / m.sum().clamp_min(1.0)


def _agg_seq_mean_token_sum(x: Tensor, m: Tensor, traj_ids: Tensor, num_traj: int) -> Tensor:
    s, c = _seq_sums(x, m, traj_ids, num_traj)
    has = c > 0
    return s[has].mean() if bool(has.any()) else x.sum() * 0.0


LOSS_AGG_MODES: dict[str, Callable[[Tensor, Tensor, Tensor, int], Tensor]] = {
    "seq-mean-token-mean": _agg_seq_mean_token_mean,
    "token-mean": _agg_token_mean,
    "seq-mean-token-sum": _agg_seq_mean_token_sum,
}


def aggregate(x: Tensor, mask: Tensor, traj_ids: Tensor, num_traj: int, mode: str) -> Tensor:
    """Aggregates per-token ``x`` ``[T]`` over valid tokens by the named mode."""
    try:
        fn = LOSS_AGG_MODES[mode]
    except KeyError:
        raise ValueError(f"unknown loss aggregation {mode!r}; valid: {sorted(LOSS_AGG_MODES)}") from None
    return fn(x, mask.to(x.dtype), traj_ids, num_traj)


class GrpoTerms(NamedTuple):
    loss: Tensor  # policy term + beta * KL term (0-dim)
    policy: Tensor  # aggregated -min(rho A, clip(rho) A)
    kl: Tensor  # aggregated k3 KL
    clip_frac: Tensor  # share of valid tokens where the clipped branch was taken
    ratio_mean: Tensor


def grpo_loss(
    logp: Tensor,
    old_logp: Tensor,
    ref_logp: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    traj_ids: Tensor,
    num_traj: int,
    *,
    clip_eps: float = 0.2,
    kl_beta: float = 0.01,
    agg: str = "seq-mean-token-mean",
) -> GrpoTerms:
    """The paper's GRPO loss. All token tensors ``[T]``; ``advantages`` per token (the trajectory's
    advantage, or a per-token transform of it such as RLSD's); ``ref_logp`` None skips the KL."""
    m = mask.to(logp.dtype)
    ratio = torch.exp(logp - old_logp.detach())
    adv = advantages.detach().to(logp.dtype)
    unclipped = ratio * adv
    clipped = ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv
    pg = -torch.minimum(unclipped, clipped)
    policy = aggregate(pg, m, traj_ids, num_traj, agg)
    if ref_logp is not None and kl_beta != 0:
        delta = ref_logp.detach() - logp
        kl_tok = torch.exp(delta) - delta - 1
        kl = aggregate(kl_tok, m, traj_ids, num_traj, agg)
    else:
        kl = logp.sum() * 0.0
    with torch.no_grad():
        n = m.sum().clamp_min(1.0)
        clip_frac = ((clipped < unclipped).to(m.dtype) * m).sum() / n
        ratio_mean = (ratio * m).sum() / n
    return GrpoTerms(policy + kl_beta * kl, policy, kl, clip_frac, ratio_mean)


def token_coefficients(mask: Tensor, traj_ids: Tensor, num_traj: int, mode: str) -> Tensor:
    """Per-token weights ``c`` with ``aggregate(x) == sum(c * x)`` for the named mode.

    Lets a batch be split into micro-batches by token budget while the accumulated gradient
    equals the full-batch loss exactly (each micro-batch contributes ``sum(c_t x_t)``).
    """
    m = mask.to(torch.float64)
    if mode == "token-mean":
        return m / m.sum().clamp_min(1.0)
    # counts of a {0, 1} mask: whole numbers, exact in any order of addition (deterministic on CUDA too)
    cnt = torch.zeros(num_traj, dtype=torch.float64, device=m.device).index_add(0, traj_ids, m)
    n_seq = (cnt > 0).sum().clamp_min(1).to(torch.float64)
    if mode == "seq-mean-token-mean":
        return m / (cnt[traj_ids].clamp_min(1.0) * n_seq)
    if mode == "seq-mean-token-sum":
        return m / n_seq
    raise ValueError(f"unknown loss aggregation {mode!r}; valid: {sorted(LOSS_AGG_MODES)}")


def ppo_clip_terms(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, clip_eps: float = 0.2, clip_eps_high: Optional[float] = None
) -> tuple[Tensor, Tensor]:
    """PPO's clipped-ratio policy term per token, ``-min(rho A, clip(rho, 1 - eps, 1 + eps_high) A)``
    with ``rho = exp(logp - sg(logp_old))`` (``eps_high`` = ``clip_eps_high``, DAPO's higher upper
    clip; None: ``clip_eps``), and the indicator that the clipped branch was taken, ``[T]`` each
    (``logp`` differentiable, ``old_logp`` and ``advantages`` detached)."""
    high = clip_eps if clip_eps_high is None else clip_eps_high
    ratio = torch.exp(logp - old_logp.detach())
    adv = advantages.detach().to(logp.dtype)
    unclipped = ratio * adv
    clipped = ratio.clamp(1 - clip_eps, 1 + high) * adv
    return -torch.minimum(unclipped, clipped), (clipped < unclipped).detach()


def k3_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """The k3 estimator of KL(pi || pi_ref) per token, ``exp(Delta) - Delta - 1`` with
    ``Delta = sg(logp_ref) - logp``, ``[T]``."""
    delta = ref_logp.detach() - logp
    return torch.exp(delta) - delta - 1


def grpo_token_terms(
    logp: Tensor, old_logp: Tensor, ref_logp: Tensor | None, advantages: Tensor, clip_eps: float = 0.2
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-token policy term ``-min(rho A, clip(rho) A)``, k3 KL (zeros without ``ref_logp``) and
    the clipped indicator, each ``[T]`` (:func:`ppo_clip_terms` and :func:`k3_kl`)."""
    pg, taken = ppo_clip_terms(logp, old_logp, advantages, clip_eps)
    kl = k3_kl(logp, ref_logp) if ref_logp is not None else torch.zeros_like(logp)
    return pg, kl, taken
