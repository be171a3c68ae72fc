"""Distillation losses: the paper's weighted loss (Training Objective section), used by every
``weights`` rule of :mod:`pcsd.ops.weighting`, and Skill-SD's k3 self-distillation loss (the
``skill-sd`` rule of kind ``loss``)."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["pcsd_loss", "skill_sd_token_loss", "skill_sd_loss"]


def pcsd_loss(student_logp: Tensor, teacher_logp: Tensor, weights: Tensor, mask: Tensor) -> Tensor:
    """``L_PCSD = (1/M) sum m w (sg(teacher_logp) - student_logp)``, ``M = sum m``.

    All four tensors share one shape (packed ``[T]`` or padded ``[B, L]``): log-probs of the
    sampled tokens under the student (differentiable) and the frozen teacher, the token weights
    and the valid-token mask (bool or {0, 1} float). Teacher log-probs and weights are detached,
    so the gradient reaches only ``student_logp`` and equals ``-m w / M``. The loss is normalised
    by the number of valid tokens M, not by the sum of weights, so ``w`` sets both the allocation
    and the magnitude of distillation. Returns a 0-dim tensor (0 when no token is valid).
    """
    for name, t in (
        ("student_logp", student_logp),
        ("teacher_logp", teacher_logp),
        ("weights", weights),
        ("mask", mask),
    ):
        if not isinstance(t, Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.shape != student_logp.shape:
            raise ValueError(f"{name} must have student_logp's shape {tuple(student_logp.shape)}, got {tuple(t.shape)}")
    if not student_logp.dtype.is_floating_point:
        raise ValueError(f"student_logp must be floating point, got {student_logp.dtype}")
    m = mask.detach().to(student_logp.dtype)
    total = m.sum()
    per_token = (
        m * weights.detach().to(student_logp.dtype) * (teacher_logp.detach().to(student_logp.dtype) - student_logp)
    )
    return per_token.sum() / total.clamp_min(1.0)


def skill_sd_token_loss(
    student_logp: Tensor, teacher_logp: Tensor, old_logp: Tensor, *, neg_clamp: float = 20.0, ratio_clamp: float = 10.0
) -> Tensor:
    """Skill-SD's per-token self-distillation loss (the public SDAR code's ``compute_sdl_loss``).

    With ``l = log pi_theta - sg(log pi_teacher)`` the k3 estimator of KL(pi_theta || pi_teacher)
    ``k3 = exp(min(-l, neg_clamp)) - 1 + l``, weighted by the on-policy ratio
    ``rho = exp(min(log pi_theta - sg(log pi_old), ratio_clamp))``. The ratio is *not* detached
    (the SDAR code differentiates through both factors), so at ``pi_theta = pi_old`` the gradient
    with respect to ``log pi_theta`` is ``k3 + (1 - exp(-l)) = l``: the token's log-prob is pulled
    towards the teacher's by the signed gap, there is no gate. Returns ``[T]`` (same shape as the
    inputs); aggregate with :func:`skill_sd_loss` or a token-mean over valid tokens.
    """
    for name, t in (("teacher_logp", teacher_logp), ("old_logp", old_logp)):
        if not isinstance(t, Tensor) or t.shape != student_logp.shape:
            raise ValueError(f"{name} must be a tensor of student_logp's shape {tuple(student_logp.shape)}")
    if not student_logp.dtype.is_floating_point:
        raise ValueError(f"student_logp must be floating point, got {student_logp.dtype}")
    ell = student_logp - teacher_logp.detach().to(student_logp.dtype)
    k3 = torch.exp((-ell).clamp(max=neg_clamp)) - 1.0 + ell
    rho = torch.exp((student_logp - old_logp.detach().to(student_logp.dtype)).clamp(max=ratio_clamp))
    return rho * k3


def skill_sd_loss(
    student_logp: Tensor,
    teacher_logp: Tensor,
    old_logp: Tensor,
    mask: Tensor,
    *,
    neg_clamp: float = 20.0,
    ratio_clamp: float = 10.0,
) -> Tensor:
    """``L_SDL = (1/M) sum m rho k3`` (token-mean over the ``M`` valid tokens, as SDAR's
    ``agg_loss(..., "token-mean")``) of :func:`skill_sd_token_loss`. Skill-SD adds
    ``lambda * L_SDL`` (lambda = 0.001) to the GRPO loss, whose advantages it leaves unchanged."""
    if not isinstance(mask, Tensor) or mask.shape != student_logp.shape:
        raise ValueError(f"mask must be a tensor of student_logp's shape {tuple(student_logp.shape)}")
    m = mask.detach().to(student_logp.dtype)
    per = skill_sd_token_loss(student_logp, teacher_logp, old_logp, neg_clamp=neg_clamp, ratio_clamp=ratio_clamp)
    return (per * m).sum() / m.sum().clamp_min(1.0)
