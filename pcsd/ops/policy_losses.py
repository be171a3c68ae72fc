"""Policy-gradient losses, per token, registered by name (verl's ``register_policy_loss``):
``ppo`` and ``gspo``. The update calls the one ``algo.policy_loss`` names; the result is
aggregated like every other per-token term (``algo.loss_agg``, :func:`pcsd.ops.grpo.aggregate`).

Token tensors are packed ``[T]``: the response tokens of several turns back to back, turn ``s``
spanning ``cu_seqlens[s]:cu_seqlens[s + 1]`` (``cu_seqlens`` ``[S+1]`` int64, from 0 to T);
``mask`` ``[T]`` marks the valid tokens (bool or {0, 1}). Only ``logp`` is differentiable.

* ``ppo``: the token-level clipped ratio ``rho_t = exp(logp_t - old_t)``,
  ``-min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A)`` (DAPO's asymmetric "clip-higher" when
  ``eps_high > eps_low``; verl's ``compute_policy_loss`` without its dual clip).
* ``gspo`` (verl's ``compute_policy_loss_gspo``): one length-normalised ratio per TURN,
  ``s = exp(mean_{t in turn, valid} (logp_t - old_t))``, carried to each token as
  ``s_t = sg(s) * exp(logp_t - sg(logp_t))`` (value ``s``, gradient ``s`` d logp_t), its log
  clamped at 10, and ``max(-A s_t, -A clip(s_t, 1 - eps_low, 1 + eps_high))``. A turn is verl-agent's
  sample (one response given its prompt), so it is GSPO's sequence here (``docs/estimators.md``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch
from torch import Tensor

from pcsd.ops.registry import Registry
from pcsd.ops.segments import segment_sum

__all__ = ["PolicyLoss", "PolicyTerms", "available_policy_losses", "get_policy_loss", "register_policy_loss"]

#: GSPO's clamp on the log of the sequence ratio (verl's, for numerical stability)
GSPO_LOG_RATIO_MAX = 10.0


class PolicyTerms(NamedTuple):
    pg: Tensor  # (T,) per-token policy-gradient loss, before aggregation (0 where masked)
    clipped: Tensor  # (T,) bool: the clipped branch was taken (valid tokens only)
    ratio: Tensor  # (T,) the ratio each token's loss used (its own, or its turn's), detached


@dataclass(frozen=True)
class PolicyLoss:
    """A named loss: ``fn(logp, old_logp, advantages, cu_seqlens, mask, *, clip_low, clip_high)``."""

    name: str
    fn: Callable[..., PolicyTerms]
    doc: str = ""

    def __call__(
        self,
        logp: Tensor,
        old_logp: Tensor,
        advantages: Tensor,
        cu_seqlens: Tensor,
        mask: Tensor,
        *,
        clip_low: float,
        clip_high: float,
    ) -> PolicyTerms:
        _check(logp, old_logp, advantages, cu_seqlens, mask, clip_low, clip_high)
        return self.fn(logp, old_logp, advantages, cu_seqlens, mask, clip_low=clip_low, clip_high=clip_high)


_LOSSES: Registry[PolicyLoss] = Registry("policy loss")


def register_policy_loss(name: str, doc: str = "") -> Callable:
    """Decorator registering ``fn(logp, old_logp, advantages, cu_seqlens, mask, *, clip_low,
    clip_high) -> PolicyTerms`` under ``name``."""

    def deco(fn: Callable[..., PolicyTerms]) -> Callable[..., PolicyTerms]:
        _LOSSES.add(name, PolicyLoss(name, fn, doc or (fn.__doc__ or "")))
        return fn

    return deco


def get_policy_loss(name: str) -> PolicyLoss:
    """The policy loss registered as ``name``; ValueError listing the valid names otherwise."""
    return _LOSSES.get(name)


def available_policy_losses() -> list[str]:
    return _LOSSES.names()


def _check(logp, old_logp, adv, cu, mask, clip_low, clip_high) -> None:
    if logp.dim() != 1:
        raise ValueError(f"logp must be packed 1-D [T], got shape {tuple(logp.shape)}")
    for name, t in (("old_logp", old_logp), ("advantages", adv), ("mask", mask)):
        if t.shape != logp.shape:
            raise ValueError(f"{name} must have logp's shape {tuple(logp.shape)}, got {tuple(t.shape)}")
    if cu.dim() != 1 or cu.numel() < 1 or int(cu[0]) != 0 or int(cu[-1]) != logp.numel():
        raise ValueError(f"cu_seqlens must be 1-D offsets from 0 to T={logp.numel()}, got {cu.tolist()[:8]}")
    if cu.numel() > 1 and bool((cu[1:] < cu[:-1]).any()):
        raise ValueError("cu_seqlens must be non-decreasing")
    if not (0 < clip_low < 1 and clip_high > 0):
        raise ValueError(f"clip_low must be in (0, 1) and clip_high > 0, got {clip_low} and {clip_high}")


@register_policy_loss("ppo", doc="token-level clipped ratio, clip [1 - clip_low, 1 + clip_high]")
def _ppo(logp, old_logp, advantages, cu_seqlens, mask, *, clip_low, clip_high) -> PolicyTerms:
    ratio = torch.exp(logp - old_logp.detach())
    adv = advantages.detach().to(logp.dtype)
    unclipped = ratio * adv
    clipped = ratio.clamp(1 - clip_low, 1 + clip_high) * adv
    m = mask.to(torch.bool)
    pg = torch.where(m, -torch.minimum(unclipped, clipped), torch.zeros_like(logp))
    return PolicyTerms(pg, ((clipped < unclipped) & m).detach(), ratio.detach())


@register_policy_loss("gspo", doc="sequence (turn) level, length-normalised ratio with its clip")
def _gspo(logp, old_logp, advantages, cu_seqlens, mask, *, clip_low, clip_high) -> PolicyTerms:
    n_seg = cu_seqlens.numel() - 1
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).to(torch.int64)
    seg = torch.repeat_interleave(torch.arange(n_seg, device=logp.device), lengths.to(logp.device))
    m = mask.to(logp.dtype)
    delta = (logp - old_logp.detach()).detach()
    seq_log = segment_sum(delta * m, seg, n_seg) / segment_sum(m, seg, n_seg).clamp_min(1.0)
    log_s = (logp - logp.detach() + seq_log[seg]).clamp(max=GSPO_LOG_RATIO_MAX)
    s = torch.exp(log_s)
    adv = advantages.detach().to(logp.dtype)
    loss1 = -adv * s
    loss2 = -adv * s.clamp(1 - clip_low, 1 + clip_high)
    mb = mask.to(torch.bool)
    pg = torch.where(mb, torch.maximum(loss1, loss2), torch.zeros_like(logp))
    return PolicyTerms(pg, ((loss2 > loss1) & mb).detach(), s.detach())
