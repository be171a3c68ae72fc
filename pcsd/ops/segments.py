"""Deterministic segment sums: the reduction every group or segment statistic of :mod:`pcsd.ops`
uses instead of ``index_add_``.

``index_add_`` (and ``scatter_add_``) on CUDA add with atomics, in whatever order the threads run:
a floating sum then differs in its last bits from one call to the next, and so does everything
computed from it (GRPO's advantages, a resumed run that should be bit-exact). Here the elements
are put in a canonical order first (by segment, then by value, so the order of the input does not
matter either), laid out as a dense ``[segments, longest]`` matrix and summed along its rows: a
plain reduction, the same bits on every call and every device.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["segment_sum"]


def segment_sum(values: Tensor, ids: Tensor, num_segments: int) -> Tensor:
    """``[num_segments]``: the sum of ``values`` over each segment id, bit-identical across calls
    and whatever the order of the elements (the plain reference is
    ``zeros(num_segments).index_add_(0, ids, values)``, equal up to rounding).

    Args:
        values: ``[N]`` floating (differentiable).
        ids: ``[N]`` integer segment ids in ``[0, num_segments)``.
        num_segments: S >= 0; a segment without elements sums to 0.

    Memory: a ``[S, longest segment]`` matrix of ``values.dtype``.
    """
    if values.dim() != 1 or ids.shape != values.shape:
        raise ValueError(f"values and ids must be 1-D of one shape, got {tuple(values.shape)} and {tuple(ids.shape)}")
    if ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise ValueError(f"ids must be integer segment ids, got {ids.dtype}")
    if num_segments < 0:
        raise ValueError(f"num_segments must be >= 0, got {num_segments}")
    n = values.numel()
    if n == 0 or num_segments == 0:
        if n and num_segments == 0:
            raise ValueError("ids must be in [0, num_segments) and num_segments is 0")
        return values.new_zeros(num_segments) + values.sum() * 0  # keeps the graph for autograd
    ids = ids.long()
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= num_segments:
        raise ValueError(f"ids must be in [0, {num_segments}), got values in [{lo}, {hi}]")
    # canonical order: by value, then (stable) by segment
    order = torch.argsort(values.detach(), stable=True)
    order = order[torch.argsort(ids[order], stable=True)]
    seg = ids[order]
    counts = torch.bincount(ids, minlength=num_segments)  # integer counts: exact in any order
    starts = torch.cumsum(counts, 0) - counts
    pos = torch.arange(n, device=ids.device) - starts[seg]
    dense = values.new_zeros(num_segments, int(counts.max()))
    dense = dense.index_put((seg, pos), values[order])  # every (segment, position) once
    return dense.sum(dim=1)
