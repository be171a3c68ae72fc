"""Plain PyTorch reference of the segmented PCSD weights.

This is the test oracle for the native kernels *and* the fallback when the native module is
missing or the tensors live on a device we have no kernel for. It follows the paper's Method
section (``../shared/paper/pcsd.tex``, "Persistent Consistency Assessment" to "Trend Modulation
and Continuous Gating") term by term, vectorised over tokens with an explicit ``[T, n_max]`` window
view, processed in chunks so memory stays bounded.

Every function takes already-validated inputs (see :mod:`pcsd.ops.kernels` for the checks).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from pcsd.ops.defaults import PCSD_DEFAULTS
from pcsd.ops.segments import segment_sum

# Tokens per chunk of the windowed computation: bounds the [chunk, n_max] temporaries.
_CHUNK = 1 << 18


class PcsdStats(NamedTuple):
    """Per-token weights and diagnostics, each ``[T]``."""

    w: Tensor  # final weight, 0 at masked positions
    adaptive: Tensor  # (1 - r) dbar^(n_min) + r dbar^(n_max)
    r: Tensor  # variance-based interpolation coefficient in [0, 1]
    slope: Tensor  # masked OLS slope over the n_max window
    eta: Tensor  # trend factor in [0, 1]


def segment_ids(cu_seqlens: Tensor, total: int) -> Tensor:
    """``[T]`` int64: the segment of every token (empty segments own no token)."""
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    seg = torch.arange(lengths.numel(), device=cu_seqlens.device)
    return torch.repeat_interleave(seg, lengths, output_size=total)


def segment_scale(gap: Tensor, m: Tensor, seg: Tensor, num_segments: int, eps_scale: float) -> Tensor:
    """``[S]``: mean |gap| over each segment's valid tokens, plus ``eps_scale``."""
    abs_sum = segment_sum(gap.abs() * m, seg, num_segments)  # deterministic on CUDA too (index_add_ is not)
    cnt = torch.zeros(num_segments, dtype=gap.dtype, device=gap.device)
    cnt.index_add_(0, seg, m)  # whole numbers: exact in any order of addition
    return torch.where(cnt > 0, abs_sum / cnt.clamp_min(1), torch.zeros_like(cnt)) + eps_scale


def pcsd_weights_reference(
    gap: Tensor,
    cu_seqlens: Tensor,
    mask: Tensor | None = None,
    *,
    n_min: int = PCSD_DEFAULTS.n_min,
    n_max: int = PCSD_DEFAULTS.n_max,
    alpha: float = PCSD_DEFAULTS.alpha,
    tau_low: float = PCSD_DEFAULTS.tau_low,
    tau_high: float = PCSD_DEFAULTS.tau_high,
    gamma: float = PCSD_DEFAULTS.gamma,
    beta_gate: float = PCSD_DEFAULTS.beta_gate,
    eps_slope: float = PCSD_DEFAULTS.eps_slope,
    eps_scale: float = PCSD_DEFAULTS.eps_scale,
    adaptive: bool = True,
    trend: bool = True,
) -> PcsdStats:
    """Segmented PCSD weights in plain PyTorch, computed in ``gap.dtype``.

    Args:
        gap: ``[T]`` floating, teacher - student sampled log-prob gaps packed back to back.
        cu_seqlens: ``[S + 1]`` integer segment offsets (``cu[0] == 0``, ``cu[-1] == T``).
        mask: ``[T]`` bool or {0, 1} float valid-token mask, or None (all valid).
        adaptive: False replaces the variance-interpolated estimate by the decayed mean over the
            ``n_min`` window (the fixed-window ablations).
        trend: False sets the trend factor to 1 (the no-trend ablation).

    Returns:
        :class:`PcsdStats` of ``[T]`` tensors in ``gap.dtype``.
    """
    dt, dev = gap.dtype, gap.device
    total = gap.numel()
    num_segments = cu_seqlens.numel() - 1
    cu = cu_seqlens.to(device=dev, dtype=torch.int64)
    m = torch.ones(total, dtype=dt, device=dev) if mask is None else mask.to(dt)
    # Masked gaps never enter any sum; zeroing them keeps NaN/Inf at masked positions harmless.
    gap = torch.where(m > 0, gap, torch.zeros((), dtype=dt, device=dev))
    seg = segment_ids(cu, total)
    seg_end = cu[1:][seg]  # [T] exclusive end of each token's segment
    scale = segment_scale(gap, m, seg, num_segments, eps_scale)[seg]

    offsets = torch.arange(n_max, device=dev)
    jf = offsets.to(dt)
    decay = torch.pow(torch.tensor(alpha, dtype=dt, device=dev), jf)
    in_short = (offsets < n_min).to(dt)
    # Pad so that every window view exists; padded positions are never valid.
    gap_p = torch.cat([gap, gap.new_zeros(n_max)])
    m_p = torch.cat([m, m.new_zeros(n_max)])

    out = [torch.empty(total, dtype=dt, device=dev) for _ in range(5)]
    for start in range(0, total, _CHUNK):
        stop = min(total, start + _CHUNK)
        pos = torch.arange(start, stop, device=dev)
        idx = pos[:, None] + offsets[None, :]  # [C, n_max]
        inside = (idx < seg_end[start:stop, None]).to(dt)  # never cross the segment end
        v = gap_p[idx] * inside  # zero outside the segment and at masked positions
        valid = m_p[idx] * inside  # [C, n_max] in {0, 1}

        # Decayed means over the short and long windows; 0 when no valid token.
        a_l = decay * valid
        a_s = a_l * in_short
        den_l, den_s = a_l.sum(1), a_s.sum(1)
        dbar_l = torch.where(den_l > 0, (a_l * v).sum(1) / den_l.clamp_min(1e-30), 0.0)
        dbar_s = torch.where(den_s > 0, (a_s * v).sum(1) / den_s.clamp_min(1e-30), 0.0)

        # Masked mean and population variance over the n_max window.
        cnt = valid.sum(1)
        safe = cnt.clamp_min(1)
        mean = (valid * v).sum(1) / safe
        var = (valid * (v - mean[:, None]) ** 2).sum(1) / safe
        if adaptive:
            r = ((var - tau_low) / (tau_high - tau_low)).clamp(0.0, 1.0)
            r = torch.where(cnt > 0, r, 0.0)
        else:
            r = torch.zeros_like(var)
        adapt = (1 - r) * dbar_s + r * dbar_l

        # Masked OLS slope with offsets j = 0..n_max-1; 0 with fewer than two valid tokens.
        jbar = (valid * jf).sum(1) / safe
        dj = (jf[None, :] - jbar[:, None]) * valid
        slope = (dj * v).sum(1) / ((dj * dj).sum(1) + eps_slope)
        slope = torch.where(cnt >= 2, slope, 0.0)
        if trend:
            eta = (1 - gamma * torch.relu(-slope / scale[start:stop])).clamp(0.0, 1.0)
        else:
            eta = torch.ones_like(slope)
        w = torch.sigmoid(beta_gate * adapt) * eta * (m[start:stop] > 0).to(dt)
        for buf, val in zip(out, (w, adapt, r, slope, eta)):
            buf[start:stop] = val
    return PcsdStats(*out)


def pcsd_weights_loop(
    gap: list[float],
    cu_seqlens: list[int],
    mask: list[bool] | None = None,
    *,
    n_min: int = PCSD_DEFAULTS.n_min,
    n_max: int = PCSD_DEFAULTS.n_max,
    alpha: float = PCSD_DEFAULTS.alpha,
    tau_low: float = PCSD_DEFAULTS.tau_low,
    tau_high: float = PCSD_DEFAULTS.tau_high,
    gamma: float = PCSD_DEFAULTS.gamma,
    beta_gate: float = PCSD_DEFAULTS.beta_gate,
    eps_slope: float = PCSD_DEFAULTS.eps_slope,
    eps_scale: float = PCSD_DEFAULTS.eps_scale,
    adaptive: bool = True,
    trend: bool = True,
) -> list[float]:
    """The same weights as a literal loop over the paper's sums, in Python floats (float64).

    Slow; exists so that the vectorised reference itself is checked against the equations.
    """
    import math

    w_out = [0.0] * len(gap)
    m = [1.0 if (mask is None or mask[i]) else 0.0 for i in range(len(gap))]
    for s in range(len(cu_seqlens) - 1):
        b, e = cu_seqlens[s], cu_seqlens[s + 1]
        n_valid = sum(m[b:e])
        scale = (sum(m[t] * abs(gap[t]) for t in range(b, e)) / n_valid if n_valid else 0.0) + eps_scale
        for i in range(b, e):

            def dbar(n: int, i: int = i) -> float:
                num = sum(alpha**j * m[i + j] * gap[i + j] for j in range(n) if i + j < e)
                den = sum(alpha**j * m[i + j] for j in range(n) if i + j < e)
                return num / den if den > 0 else 0.0

            js = [j for j in range(n_max) if i + j < e and m[i + j] > 0]
            vals = [gap[i + j] for j in js]
            if js:
                mu = sum(vals) / len(js)
                var = sum((x - mu) ** 2 for x in vals) / len(js)
            else:
                var = 0.0
            r = min(1.0, max(0.0, (var - tau_low) / (tau_high - tau_low))) if (adaptive and js) else 0.0
            ad = (1 - r) * dbar(n_min) + r * dbar(n_max)
            if len(js) >= 2:
                jbar = sum(js) / len(js)
                slope = sum((j - jbar) * x for j, x in zip(js, vals)) / (sum((j - jbar) ** 2 for j in js) + eps_slope)
            else:
                slope = 0.0
            eta = min(1.0, max(0.0, 1 - gamma * max(0.0, -slope / scale))) if trend else 1.0
            sig = 1.0 / (1.0 + math.exp(-beta_gate * ad)) if beta_gate * ad > -700 else 0.0
            w_out[i] = sig * eta * m[i]
    return w_out
