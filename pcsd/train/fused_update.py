"""What :func:`pcsd.train.update.update_step` needs for its two faster paths (``optim.fused_lm_head``,
``optim.joint_frozen_pass``), kept apart from the update's own ordering.

* :func:`token_loss`: the micro-batch loss of the update as per-token terms, ``[n]`` with
  ``sum(token_loss) == pg + kl_beta * kl + lambda * pcsd`` of the update's micro-batch, for
  :func:`pcsd.ops.fused.fused_logprob_loss` (which needs the loss's derivative token by token in
  its forward pass). The update computes the same loss the plain way from the fused pass's
  log-probs for its statistics and :func:`check_fused_loss` compares the two, so a loss term
  added to the update but not here fails loudly instead of training on a different loss.
* :func:`joint_scores`: reference and teacher log-probs from one frozen-model forward per
  micro-batch, the two contexts of every row side by side.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

from pcsd.ops.grpo import grpo_token_terms
from pcsd.ops.scoring import greedy_microbatches, score_packed

__all__ = ["token_loss", "check_fused_loss", "pair_microbatches", "joint_scores"]


def token_loss(
    lp: Tensor,
    old: Tensor,
    ref: Optional[Tensor],
    adv: Tensor,
    coef: Tensor,
    teacher: Optional[Tensor],
    weights: Tensor,
    mask: Tensor,
    algo,
    distill_scale: float,
) -> Tensor:
    """Per-token loss ``[n]`` of the update (all tensors ``[n]``, only ``lp`` differentiable):
    ``c pg`` when ``algo.grpo``, ``c kl_beta kl`` when ``ref`` is given (OPSD keeps the KL term),
    plus ``lambda_distill * distill_scale * m w (sg(teacher) - lp)`` when ``algo.distill`` with a weights rule (``distill_scale`` = the
    micro-batch's ``1 / max(M_mb, 1) * n_mb / T_all`` of :func:`pcsd.ops.losses.pcsd_loss`;
    pass ``teacher=None`` for rules that transform advantages instead)."""
    out = torch.zeros_like(lp)
    if algo.grpo or ref is not None:
        pg, kl, _ = grpo_token_terms(lp, old, ref, adv, algo.clip_eps)
        if algo.grpo:
            out = out + coef * pg
        out = out + algo.kl_beta * (coef * kl)
    if teacher is not None:
        m = mask.detach().to(lp.dtype)
        out = out + algo.lambda_distill * distill_scale * (
            m * weights.detach().to(lp.dtype) * (teacher.detach().to(lp.dtype) - lp)
        )
    return out


def check_fused_loss(fused: Tensor, plain: Tensor) -> None:
    """RuntimeError unless the fused per-token loss equals the update's micro-batch loss."""
    a, b = float(fused.detach()), float(plain.detach())
    if not abs(a - b) <= 1e-4 * max(abs(a), abs(b)) + 1e-6:
        raise RuntimeError(
            f"optim.fused_lm_head: the per-token loss ({a!r}) differs from the update's micro-batch "
            f"loss ({b!r}); a loss term of pcsd.train.update is missing from "
            "pcsd.train.fused_update.token_loss (set optim.fused_lm_head=false to train without it)"
        )


def pair_microbatches(
    prompts: Sequence[Sequence[int]],
    teacher_prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    budget: int,
) -> list[list[int]]:
    """Rows grouped greedily in order so that both contexts of a micro-batch's rows,
    ``(|p| + |r|) + (|p_teacher| + |r|)`` summed, fit ``budget`` tokens (a row over the budget
    alone is a micro-batch of its own); rows without response tokens are left out."""
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")
    return greedy_microbatches(
        [len(p) + len(tp) + 2 * len(r) if r else 0 for p, tp, r in zip(prompts, teacher_prompts, responses)], budget
    )


def joint_scores(
    model, prompts, teacher_prompts, responses, mbs: list[list[int]], n_passes: int, T: int
) -> tuple[Tensor, Tensor]:
    """``([T], [T])`` float32 log-probs of every packed response token under ``model`` given the
    row's ``prompts`` and given its ``teacher_prompts``: one forward per micro-batch of ``mbs``
    (see :func:`pair_microbatches`) with both contexts of each row in it, padded to ``n_passes``
    forwards (FSDP: every rank runs the same number of passes)."""
    dev = next(model.parameters()).device
    ref = torch.zeros(T, device=dev)
    teacher = torch.zeros(T, device=dev)
    offsets = [0]
    for r in responses:
        offsets.append(offsets[-1] + len(r))
    with torch.no_grad():
        for k in range(n_passes):
            if k >= len(mbs):  # padding pass
                score_packed(model, [[0]], [[0]])
                continue
            rows = mbs[k]
            ctxs = [prompts[i] for i in rows] + [teacher_prompts[i] for i in rows]
            rs = [responses[i] for i in rows] * 2
            lps = score_packed(model, ctxs, rs, max_tokens_per_pass=sum(len(p) + len(r) for p, r in zip(ctxs, rs)))
            idx = torch.cat([torch.arange(offsets[i], offsets[i + 1]) for i in rows]).to(dev)
            ref[idx] = torch.cat(lps[: len(rows)]).float()
            teacher[idx] = torch.cat(lps[len(rows) :]).float()
    return ref, teacher
