"""The losses of a training update, as per-token functions.

* :func:`update_token_loss`: **the** per-token loss of the update, ``[n]`` with ``sum = pg +
  kl_beta * kl + lambda * distill`` of a micro-batch (``distill``: the rule's term summed over the
  micro-batch / M, M the batch's valid tokens), used by both of the update's paths: summed
  with autograd on the plain path, and as the loss function of the fused lm-head
  (:func:`pcsd.ops.fused.fused_logprob_loss`, which needs each token's loss as a function of that
  token's log-prob during its forward pass). Its inputs are a :class:`TokenTerms` (the packed
  per-token terms of whole response turns) and a :class:`LossSpec` (the update's constants).
* The policy-gradient term's signature, :data:`PolicyLoss` (the terms chosen by name, ``ppo`` and
  ``gspo``, are in :mod:`pcsd.ops.policy_losses`).
* The distillation losses: the paper's weighted loss (Training Objective section,
  :func:`pcsd_loss` and its per-token form :func:`pcsd_token_loss`, used by every ``weights`` rule
  of :mod:`pcsd.ops.weighting`) and Skill-SD's k3 self-distillation loss (the ``skill-sd`` rule).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, NamedTuple, Optional

import torch
from torch import Tensor

from pcsd.ops.grpo import k3_kl

__all__ = [
    "TokenTerms",
    "RuleLoss",
    "PolicyLoss",
    "LossSpec",
    "LossParts",
    "update_token_loss",
    "pcsd_loss",
    "pcsd_token_loss",
    "skill_sd_token_loss",
    "skill_sd_loss",
    "sdpo_token_loss",
]


@dataclass(frozen=True)
class TokenTerms:
    """The packed per-token terms of whole response turns, back to back: ``[n]`` tensors on one
    device (``segments`` the turns' offsets ``[0, ..., n]`` as Python ints). Everything is detached
    data; the loss's only differentiable input is the student's log-probs, given separately.

    A weighting rule (:meth:`pcsd.ops.weighting.WeightRule.terms`) reads these and gives back the
    advantages, weights and per-token loss term (``rule_loss``) that the update puts here."""

    old_logp: Tensor  # [n] log pi_old of the sampled tokens
    advantages: Tensor  # [n] float32 the policy-gradient term's advantages (after the rule)
    coef: Tensor  # [n] aggregation coefficients: sum(coef * x) is the aggregated x (algo.loss_agg)
    mask: Tensor  # [n] bool valid tokens
    traj_ids: Tensor  # [n] int64 each token's trajectory
    segments: tuple[int, ...]  # [S+1] offsets of the response turns (cu_seqlens), 0 .. n
    gap: Tensor  # [n] float32 log pi_teacher - log pi_old (zeros without a teacher)
    ref_logp: Optional[Tensor] = None  # [n] log pi_ref (None: no KL term)
    teacher_logp: Optional[Tensor] = None  # [n] log pi_teacher (None: no teacher scored)
    weights: Optional[Tensor] = None  # [n] the rule's distillation weights (None: it has none)
    rule_loss: Optional["RuleLoss"] = None  # the rule's per-token loss term (None: none)
    # [n] bool: the token's turn has a teacher context (algo.teacher_context=group-success: a turn whose group
    # had no other success and whose teacher reads no skills has none); None: every turn has one
    teacher_mask: Optional[Tensor] = None

    @property
    def distill_mask(self) -> Tensor:
        """``[n]`` bool: the valid tokens a distillation term may read (valid, with a teacher context)."""
        return self.mask if self.teacher_mask is None else self.mask & self.teacher_mask

    @property
    def cu_seqlens(self) -> Tensor:
        """``[S+1]`` int64 ``segments`` on the terms' device."""
        return torch.tensor(self.segments, dtype=torch.int64, device=self.mask.device)

    def slice(self, lo: int, hi: int) -> TokenTerms:
        """The terms of tokens ``lo:hi``, which must be whole turns (``lo`` and ``hi`` in ``segments``)."""
        if lo not in self.segments or hi not in self.segments or hi < lo:
            raise ValueError(f"slice({lo}, {hi}) must cut at turn boundaries {list(self.segments)[:8]}...")
        cut: dict[str, Any] = {
            k: (v[lo:hi] if isinstance(v, Tensor) else v)
            for k, v in vars(self).items()
            if k not in ("segments", "rule_loss")
        }
        segs = tuple(x - lo for x in self.segments if lo <= x <= hi)
        return replace(self, segments=segs, **cut)


#: ``f(logp [n], terms) -> [n]``: a rule's per-token loss term given the student's differentiable
#: log-probs (0 at masked positions); the update adds ``algo.lambda_distill`` x its token-mean over
#: the batch's valid tokens. A token's term may read the whole turn it belongs to.
RuleLoss = Callable[[Tensor, TokenTerms], Tensor]

#: ``f(logp [n], terms, algo) -> (policy term [n], clipped [n] bool)``: the per-token policy-gradient
#: term before aggregation (the update multiplies it by ``terms.coef``), reading the settings it
#: needs from ``algo`` (the config's ``algo`` section: ``clip_eps``, ...); registered by name in
#: :mod:`pcsd.ops.policy_losses`.
PolicyLoss = Callable[[Tensor, TokenTerms, Mapping[str, Any]], tuple[Tensor, Tensor]]


class LossSpec(NamedTuple):
    """The constants of one update's per-token loss."""

    policy_loss: Optional[PolicyLoss]  # None: no policy-gradient term (algo.grpo=false)
    algo: Mapping[str, Any]  # the settings the policy loss reads
    kl_beta: float  # the KL term's coefficient (read where terms carry ref_logp)
    lambda_distill: float  # the rule loss's coefficient
    valid_tokens: float  # M: the batch's valid tokens over every rank (the rule loss's token-mean)


class LossParts(NamedTuple):
    """The per-token loss and its parts, ``[n]`` each: ``total = pg + kl_beta kl + (lambda / M) distill``."""

    total: Tensor
    pg: Tensor  # coef x the policy term (0 without one)
    kl: Tensor  # coef x k3 KL to the reference (0 without a reference)
    distill: Tensor  # the rule's per-token term, unnormalised: it enters as lambda x sum / M (0 without one)
    clipped: Tensor  # bool: the policy term took its clipped branch


def update_token_loss(logp: Tensor, t: TokenTerms, spec: LossSpec) -> LossParts:
    """The update's per-token loss of the student's log-probs ``logp`` ``[n]`` (differentiable;
    token ``i``'s loss depends on ``logp`` of ``i``'s turn only, on ``logp[i]`` alone for every
    rule and policy loss of today): the policy term and the KL term, each weighted by the
    aggregation coefficients, plus the rule's term over the batch's valid tokens."""
    zero = torch.zeros_like(logp)
    pg, clipped = zero, torch.zeros_like(t.mask, dtype=torch.bool)
    if spec.policy_loss is not None:
        pg_tok, clipped = spec.policy_loss(logp, t, spec.algo)
        pg = t.coef * pg_tok
    kl = zero if t.ref_logp is None else t.coef * k3_kl(logp, t.ref_logp)
    term = zero if t.rule_loss is None else t.rule_loss(logp, t)
    total = pg + spec.kl_beta * kl + (spec.lambda_distill / spec.valid_tokens) * term  # lambda / M: one factor
    return LossParts(total, pg, kl, term, clipped)


def pcsd_token_loss(student_logp: Tensor, teacher_logp: Tensor, weights: Tensor, mask: Tensor) -> Tensor:
    """``m w (sg(teacher_logp) - student_logp)`` per token, in ``student_logp``'s dtype (the terms of
    :func:`pcsd_loss`, unnormalised; weights detached)."""
    m = mask.detach().to(student_logp.dtype)
    return m * weights.detach().to(student_logp.dtype) * (teacher_logp.detach().to(student_logp.dtype) - student_logp)


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
    total = mask.detach().to(student_logp.dtype).sum()
    return pcsd_token_loss(student_logp, teacher_logp, weights, mask).sum() / total.clamp_min(1.0)


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


def sdpo_token_loss(
    student_logp: Tensor, teacher_logp: Tensor, old_logp: Tensor, *, is_clip: Optional[float] = 2.0
) -> Tensor:
    """SDPO's sampled-token self-distillation loss per token (the public SDPO code's
    ``compute_self_distillation_loss`` with ``full_logit_distillation=False``, reverse KL):
    ``sg(log pi - log pi_teacher) log pi``, times the importance weight of the sampled token
    ``min(exp(clamp(sg(log pi - log pi_old), -20, 20)), is_clip)`` (``is_clip=None``: no weight).
    Its gradient with respect to ``log pi`` is the weighted log-ratio to the teacher: tokens the
    teacher finds likelier than the student are pushed up, the others down. ``[T]`` like the inputs."""
    for name, t in (("teacher_logp", teacher_logp), ("old_logp", old_logp)):
        if not isinstance(t, Tensor) or t.shape != student_logp.shape:
            raise ValueError(f"{name} must be a tensor of student_logp's shape {tuple(student_logp.shape)}")
    if not student_logp.dtype.is_floating_point:
        raise ValueError(f"student_logp must be floating point, got {student_logp.dtype}")
    if is_clip is not None and not is_clip > 0:
        raise ValueError(f"is_clip must be > 0 or None, got {is_clip!r}")
    log_ratio = (student_logp - teacher_logp.to(student_logp.dtype)).detach()
    per = log_ratio * student_logp
    if is_clip is not None:
        lr = (student_logp - old_logp.to(student_logp.dtype)).detach().clamp(-20.0, 20.0)
        per = per * torch.exp(lr).clamp(max=is_clip)
    return per
