"""Reference and teacher log-probs from one frozen-model forward per micro-batch
(``optim.joint_frozen_pass``), kept apart from the update's own ordering (:mod:`pcsd.train.update`):

* :func:`pair_microbatches`: rows grouped so that both contexts of each row fit the token budget;
* :func:`joint_scores`: one forward per such micro-batch with the two contexts of every row side
  by side.

The update's other fast path, the fused lm-head (``optim.fused_lm_head``), needs nothing here: it
hands the one per-token loss of both paths, :func:`pcsd.ops.losses.update_token_loss`, to
:func:`pcsd.ops.fused.fused_score_loss`.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from pcsd.ops.scoring import greedy_microbatches, score_packed

__all__ = ["pair_microbatches", "joint_scores"]


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
