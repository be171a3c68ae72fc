"""Distillation loss of the paper (Training Objective section)."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["pcsd_loss"]


def pcsd_loss(student_logp: Tensor, teacher_logp: Tensor, weights: Tensor, mask: Tensor) -> Tensor:
    """``L_PCSD = (1/M) sum m w (sg(teacher_logp) - student_logp)``, ``M = sum m``.

    All four tensors share one shape (packed ``[T]`` or padded ``[B, L]``): log-probs of the
    sampled tokens under the student (differentiable) and the frozen teacher, the token weights
    and the valid-token mask (bool or {0, 1} float). Teacher log-probs and weights are detached,
    so the gradient reaches only ``student_logp`` and equals ``-m w / M``. The loss is normalised
    by the number of valid tokens M, not by the sum of weights, so ``w`` sets both the allocation
    and the magnitude of distillation. Returns a 0-dim tensor (0 when no token is valid).
    """
    for name, t in (("student_logp", student_logp), ("teacher_logp", teacher_logp),
                    ("weights", weights), ("mask", mask)):
        if not isinstance(t, Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.shape != student_logp.shape:
            raise ValueError(f"{name} must have student_logp's shape {tuple(student_logp.shape)}, "
                             f"got {tuple(t.shape)}")
    if not student_logp.dtype.is_floating_point:
        raise ValueError(f"student_logp must be floating point, got {student_logp.dtype}")
    m = mask.detach().to(student_logp.dtype)
    total = m.sum()
    per_token = m * weights.detach().to(student_logp.dtype) * (
        teacher_logp.detach().to(student_logp.dtype) - student_logp)
    return per_token.sum() / total.clamp_min(1.0)
