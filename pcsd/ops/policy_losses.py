"""Policy-gradient losses, per token, registered by name (verl's ``register_policy_loss``): ``ppo``
and ``gspo``. The update looks up the one ``algo.policy_loss`` names and hands it to the one
per-token loss (:func:`pcsd.ops.losses.update_token_loss`), which multiplies the term by the
aggregation coefficients (``algo.loss_agg``) like every other term; it never branches on the name.

A policy loss is ``fn(logp, terms, algo) -> (term [n], clipped [n] bool)``: ``logp`` the student's
differentiable log-probs of a micro-batch's (or a fused chunk's) tokens, ``terms`` their
:class:`pcsd.ops.losses.TokenTerms` (old log-probs, advantages, mask, ``cu_seqlens`` of the
response turns: chunks never split a turn), ``algo`` the config's ``algo`` section (``clip_eps``,
``clip_eps_high``).

* ``ppo``: the token-level clipped ratio ``rho_t = exp(logp_t - old_t)``,
  ``-min(rho A, clip(rho, 1 - clip_eps, 1 + clip_eps_high) A)`` (:func:`pcsd.ops.grpo.ppo_clip_terms`;
  DAPO's asymmetric "clip-higher" when ``clip_eps_high > clip_eps``; verl's ``compute_policy_loss``
  without its dual clip).
* ``gspo`` (verl's ``compute_policy_loss_gspo``, :func:`gspo_clip_terms`): one length-normalised
  ratio per response TURN, ``s = exp(mean_{t in turn, valid} (logp_t - old_t))``, carried to each
  token as ``s_t = sg(s) * exp(logp_t - sg(logp_t))`` (value ``s``, gradient ``s`` d logp_t), its
  log clamped at 10, and ``max(-A s_t, -A clip(s_t, 1 - clip_eps, 1 + clip_eps_high))``. A turn is
  verl-agent's sample (one response given its prompt), so it is GSPO's sequence here
  (``docs/estimators.md``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional

import torch
from torch import Tensor

from pcsd.ops.grpo import ppo_clip_terms
from pcsd.ops.registry import Registry
from pcsd.ops.segments import segment_sum

if TYPE_CHECKING:
    from pcsd.ops.losses import PolicyLoss, TokenTerms

__all__ = ["available_policy_losses", "get_policy_loss", "gspo_clip_terms", "gspo_ratio", "register_policy_loss"]

#: GSPO's clamp on the log of the sequence ratio (verl's, for numerical stability)
GSPO_LOG_RATIO_MAX = 10.0

_LOSSES: Registry["PolicyLoss"] = Registry("policy loss")


def register_policy_loss(name: str) -> Callable[["PolicyLoss"], "PolicyLoss"]:
    """Decorator registering ``fn(logp, terms, algo) -> (term [n], clipped [n])`` under ``name``."""

    def deco(fn: "PolicyLoss") -> "PolicyLoss":
        _LOSSES.add(name, fn)
        return fn

    return deco


def get_policy_loss(name: str) -> "PolicyLoss":
    """The policy loss registered as ``name``; ValueError listing the valid names otherwise."""
    return _LOSSES.get(name)


def available_policy_losses() -> list[str]:
    return _LOSSES.names()


def _clips(algo: Mapping[str, Any]) -> tuple[float, float]:
    """``(clip_eps, clip_eps_high)``: the ratio's lower and upper clip (the upper: ``clip_eps`` unless set)."""
    low = float(algo["clip_eps"])
    high: Optional[float] = algo.get("clip_eps_high")
    return low, low if high is None else float(high)


@register_policy_loss("ppo")
def _ppo(logp: Tensor, t: "TokenTerms", algo: Mapping[str, Any]) -> tuple[Tensor, Tensor]:
    """PPO's token-level clipped ratio (:func:`pcsd.ops.grpo.ppo_clip_terms`)."""
    low, high = _clips(algo)
    pg, clipped = ppo_clip_terms(logp, t.old_logp, t.advantages, low, high)
    return pg, clipped & t.mask  # masked tokens: coefficient 0 for the term, never counted as clipped


@register_policy_loss("gspo")
def _gspo(logp: Tensor, t: "TokenTerms", algo: Mapping[str, Any]) -> tuple[Tensor, Tensor]:
    """GSPO's turn-level ratio with its clip (:func:`gspo_clip_terms`)."""
    low, high = _clips(algo)
    return gspo_clip_terms(logp, t.old_logp, t.advantages, t.cu_seqlens, t.mask, low, high)


def _turn_ids(cu_seqlens: Tensor, n: int, device: torch.device) -> Tensor:
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1 or int(cu_seqlens[0]) != 0 or int(cu_seqlens[-1]) != n:
        raise ValueError(f"cu_seqlens must be 1-D offsets from 0 to T={n}, got {cu_seqlens.tolist()[:8]}")
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).to(torch.int64)
    if bool((lengths < 0).any()):
        raise ValueError("cu_seqlens must be non-decreasing")
    return torch.repeat_interleave(torch.arange(lengths.numel(), device=device), lengths.to(device))


def gspo_ratio(logp: Tensor, old_logp: Tensor, cu_seqlens: Tensor, mask: Tensor) -> Tensor:
    """``[T]`` GSPO's ratio of each token's turn, ``exp(mean over the turn's valid tokens of (logp -
    old))`` as the value, ``exp(logp - sg(logp))`` times it as the gradient (``sg(s) pi / sg(pi)``);
    its log clamped at :data:`GSPO_LOG_RATIO_MAX`. ``cu_seqlens`` ``[S+1]``: the turns' offsets."""
    turn = _turn_ids(cu_seqlens, logp.numel(), logp.device)
    n_turns = cu_seqlens.numel() - 1
    m = mask.to(logp.dtype)
    delta = (logp - old_logp.detach()).detach()
    seq = segment_sum(delta * m, turn, n_turns) / segment_sum(m, turn, n_turns).clamp_min(1.0)
    return torch.exp((logp - logp.detach() + seq[turn]).clamp(max=GSPO_LOG_RATIO_MAX))


def gspo_clip_terms(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    cu_seqlens: Tensor,
    mask: Tensor,
    clip_eps: float = 0.2,
    clip_eps_high: Optional[float] = None,
) -> tuple[Tensor, Tensor]:
    """GSPO's policy term per token, ``max(-A s, -A clip(s, 1 - eps, 1 + eps_high))`` with ``s`` the
    turn's ratio (:func:`gspo_ratio`), 0 at masked tokens, and the clipped indicator (valid tokens
    only); ``[T]`` each, all token tensors ``[T]``, ``cu_seqlens`` ``[S+1]``."""
    for name, x in (("old_logp", old_logp), ("advantages", advantages), ("mask", mask)):
        if x.shape != logp.shape:
            raise ValueError(f"{name} must have logp's shape {tuple(logp.shape)}, got {tuple(x.shape)}")
    high = clip_eps if clip_eps_high is None else clip_eps_high
    s = gspo_ratio(logp, old_logp, cu_seqlens, mask)
    adv = advantages.detach().to(logp.dtype)
    loss1 = -adv * s
    loss2 = -adv * s.clamp(1 - clip_eps, 1 + high)
    valid = mask.to(torch.bool)
    pg = torch.where(valid, torch.maximum(loss1, loss2), torch.zeros_like(logp))
    return pg, ((loss2 > loss1) & valid).detach()
