"""The segmented PCSD weights op: native CPU/CUDA kernels behind one typed, validated wrapper.

Packed varlen contract (in the manner of ``flash_attn_varlen_func``)::

    gap         float32 [T]      teacher - student sampled log-prob gaps, all responses back to back
    cu_seqlens  int32|int64 [S+1] cu[0] == 0, non-decreasing, cu[-1] == T;
                                 segment s = one response turn = gap[cu[s]:cu[s+1]] (may be empty)
    mask        bool|float [T]   valid tokens (float must be exactly 0 or 1); None = all valid
    out         float32 [T]      optional preallocated output, written in place and returned

Windows are truncated at the segment end and never cross it. The math (paper, Method section):

    dbar_N[i] = sum_j a^j m[i+j] g[i+j] / sum_j a^j m[i+j]        j = 0..N-1, 0 if no valid token
    r         = clip((var_{n_max} - tau_low) / (tau_high - tau_low), 0, 1)   population variance
    adaptive  = (1 - r) dbar_{n_min} + r dbar_{n_max}
    slope     = sum m (j - jbar) g / (sum m (j - jbar)^2 + eps_slope)        0 if < 2 valid tokens
    scale     = mean |g| over the segment's valid tokens + eps_scale
    eta       = clip(1 - gamma relu(-slope / scale), 0, 1)
    w         = sigmoid(beta_gate adaptive) eta,  and 0 at masked positions

Dispatch (the explicit fallback of vllm's ``_custom_ops``): CPU tensors use the compiled
``pcsd._C`` kernel; CUDA tensors use its CUDA kernel when it was compiled; anything else (another
device, or the native module missing) runs :func:`pcsd.ops.reference.pcsd_weights_reference`.
The kernels are registered as ``torch.library`` custom ops (``pcsd::pcsd_weights`` and friends)
with fake implementations, so callers work under ``torch.compile(fullgraph=True)``; an eager call on
plain CPU or CUDA tensors runs the same code without the ops' dispatcher (0.1-0.2 ms of host time
saved per call). The value checks cost the kernels nothing extra: the CPU kernel checks while it
computes, the CUDA kernels while they read (``cu_seqlens`` in their first launch, which stops the
others when it is malformed, the gaps' finiteness in the second), and the call reads their verdict
back in one 32-byte transfer (the one host synchronisation of a CUDA call); the torch-op checks of
:func:`_check_data` remain for the reference path (other devices, no native module).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Optional

import torch
from torch import Tensor

from pcsd import _native
from pcsd.ops.defaults import PCSD_DEFAULTS
from pcsd.ops.reference import PcsdStats, pcsd_weights_reference

__all__ = ["PcsdStats", "pcsd_weights", "pcsd_weights_padded", "kernel_for"]

_STATUS_MESSAGES = {
    1: "cu_seqlens[0] must be 0",
    2: "cu_seqlens must be non-decreasing",
    3: "cu_seqlens[-1] must equal the number of tokens T",
    4: "gap must be finite (no NaN or +-Inf) at valid (unmasked) positions",
}


# ----------------------------------------------------------------------------- validation
def _check_params(*params: Any) -> None:
    """The scalar arguments' checks, remembered for values already accepted (a trainer calls the
    op with the same nine values every time; the cache is keyed by value *and* type, so ``True``
    is not taken for an accepted ``1``, and a NaN never matches itself)."""
    try:
        _check_params_cached(*params)
    except TypeError:  # an unhashable argument: checked (and refused) uncached
        _check_params_once(*params)


@functools.lru_cache(maxsize=64, typed=True)
def _check_params_cached(*params: Any) -> None:
    _check_params_once(*params)


def _check_params_once(
    n_min: Any,
    n_max: Any,
    alpha: Any,
    tau_low: Any,
    tau_high: Any,
    gamma: Any,
    beta_gate: Any,
    eps_slope: Any,
    eps_scale: Any,
) -> None:
    def is_int(x: Any) -> bool:
        return isinstance(x, int) and not isinstance(x, bool)

    def finite(name: str, x: Any) -> float:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
            raise ValueError(f"{name} must be a finite number, got {x!r}")
        return float(x)

    if not is_int(n_min) or n_min < 1:
        raise ValueError(f"n_min must be an integer >= 1, got {n_min!r}")
    if not is_int(n_max) or n_max < n_min:
        raise ValueError(f"n_max must be an integer >= n_min ({n_min}), got {n_max!r}")
    a = finite("alpha", alpha)
    if not 0.0 < a <= 1.0:
        raise ValueError(f"alpha must be in (0, 1], got {alpha!r}")
    lo, hi = finite("tau_low", tau_low), finite("tau_high", tau_high)
    if not lo < hi:
        raise ValueError(f"tau_low must be < tau_high, got tau_low={tau_low!r}, tau_high={tau_high!r}")
    if finite("beta_gate", beta_gate) < 0:
        raise ValueError(f"beta_gate must be >= 0, got {beta_gate!r}")
    if finite("gamma", gamma) < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma!r}")
    if finite("eps_slope", eps_slope) <= 0:
        raise ValueError(f"eps_slope must be > 0, got {eps_slope!r}")
    if finite("eps_scale", eps_scale) <= 0:
        raise ValueError(f"eps_scale must be > 0, got {eps_scale!r}")


def check_pcsd_params(**params: Any) -> None:
    """The op's own check of its scalar arguments (``n_min`` ... ``eps_scale``, all nine), raising
    the ``ValueError`` a call would raise; for configurations validated before the first call."""
    _check_params_once(**params)


def _check_tensors(gap: Any, cu_seqlens: Any, mask: Any, out: Any) -> None:
    """Static checks (dtype, rank, device, lengths): safe inside torch.compile."""
    if not isinstance(gap, Tensor):
        raise ValueError(f"gap must be a torch.Tensor, got {type(gap).__name__}")
    if gap.dtype != torch.float32:
        raise ValueError(f"gap must be float32, got {gap.dtype}")
    if gap.dim() != 1:
        raise ValueError(f"gap must be 1-D [T] (packed tokens), got shape {tuple(gap.shape)}")
    if not isinstance(cu_seqlens, Tensor):
        raise ValueError(f"cu_seqlens must be a torch.Tensor, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"cu_seqlens must be int32 or int64, got {cu_seqlens.dtype}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1:
        raise ValueError(f"cu_seqlens must be 1-D [S+1] with S >= 0, got shape {tuple(cu_seqlens.shape)}")
    if cu_seqlens.device != gap.device:
        raise ValueError(f"cu_seqlens must be on gap's device {gap.device}, got {cu_seqlens.device}")
    if mask is not None:
        if not isinstance(mask, Tensor):
            raise ValueError(f"mask must be a torch.Tensor or None, got {type(mask).__name__}")
        if mask.dtype != torch.bool and not mask.dtype.is_floating_point:
            raise ValueError(f"mask must be bool or a float {{0, 1}} tensor, got {mask.dtype}")
        if mask.shape != gap.shape:
            raise ValueError(f"mask must have gap's shape {tuple(gap.shape)}, got {tuple(mask.shape)}")
        if mask.device != gap.device:
            raise ValueError(f"mask must be on gap's device {gap.device}, got {mask.device}")
    if out is not None:
        if not isinstance(out, Tensor) or out.dtype != torch.float32 or out.shape != gap.shape:
            raise ValueError(
                f"out must be a float32 tensor of gap's shape {tuple(gap.shape)}, got "
                f"{getattr(out, 'dtype', type(out).__name__)} {tuple(getattr(out, 'shape', ()))}"
            )
        if out.device != gap.device:
            raise ValueError(f"out must be on gap's device {gap.device}, got {out.device}")
        if not out.is_contiguous():
            raise ValueError("out must be contiguous")


def _check_data(gap: Tensor, cu: Tensor, mask: Optional[Tensor]) -> None:
    """Value checks with torch ops (the CUDA and reference paths; the CPU kernel checks the same
    things itself in the pass that computes the weights): ``cu_seqlens`` starts at 0, never
    decreases and ends at T; ``gap`` is finite at valid positions; a float ``mask`` holds only 0
    and 1. Every condition is reduced on the device and the flags are read in ONE transfer (one
    host synchronisation per call on CUDA); the message is worked out only when one fails."""
    flags = [cu[0] != 0, cu[-1] != gap.numel()]
    if cu.numel() > 1:
        flags.append((cu[1:] < cu[:-1]).any())
    bad = torch.isfinite(gap).logical_not_()
    if mask is not None:
        bad.logical_and_(mask if mask.dtype == torch.bool else mask != 0)
        if mask.dtype != torch.bool:
            flags.append(((mask != 0) & (mask != 1)).any())
    flags.append(bad.any())
    if not any(torch.stack(flags).tolist()):
        return
    if mask is not None and mask.dtype != torch.bool and bool(((mask != 0) & (mask != 1)).any()):
        raise ValueError("mask: a float mask must hold only 0 and 1 (soft masks are not supported)")
    if int(cu[0]) != 0:
        raise ValueError(f"cu_seqlens: {_STATUS_MESSAGES[1]}, got {int(cu[0])}")
    if cu.numel() > 1 and bool((cu[1:] < cu[:-1]).any()):
        s = int(torch.nonzero(cu[1:] < cu[:-1])[0, 0])
        raise ValueError(f"cu_seqlens: {_STATUS_MESSAGES[2]}; cu_seqlens[{s + 1}] < cu_seqlens[{s}]")
    if int(cu[-1]) != gap.numel():
        raise ValueError(f"cu_seqlens: {_STATUS_MESSAGES[3]} ({gap.numel()}), got {int(cu[-1])}")
    i = int(torch.nonzero(bad)[0, 0])
    raise ValueError(f"gap: {_STATUS_MESSAGES[4]}; gap[{i}] = {float(gap[i])}")


def _mask_u8(mask: Optional[Tensor], check: bool = True) -> Optional[Tensor]:
    """The mask as the kernels read it (uint8 0/1, a view of a bool mask); ``check``: refuse a
    float mask with values other than 0 and 1 here (the kernels' paths; :func:`_check_data` does
    it on the reference path)."""
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        return mask.contiguous().view(torch.uint8)
    if check and bool(((mask != 0) & (mask != 1)).any()):
        raise ValueError("mask: a float mask must hold only 0 and 1 (soft masks are not supported)")
    return (mask != 0).contiguous().view(torch.uint8)


def _raise_status(status: int, where: int, gap: Tensor, cu: Tensor) -> None:
    """The ``ValueError`` for a kernel's validation status (the CPU kernel's and the CUDA kernels'
    codes are the same: ``pcsd_kernels.h``)."""
    if status == 2:
        raise ValueError(f"cu_seqlens: {_STATUS_MESSAGES[2]}; cu_seqlens[{where + 1}] < cu_seqlens[{where}]")
    if status == 4:
        raise ValueError(f"gap: {_STATUS_MESSAGES[4]}; gap[{where}] = {float(gap[where])}")
    got = int(cu[0]) if status == 1 else int(cu[-1])
    raise ValueError(f"cu_seqlens: {_STATUS_MESSAGES[status]} (T={gap.numel()}), got {got}")


def _cuda_call(device: torch.device, fn: Any) -> Any:
    """``fn(stream)`` with ``device`` current (the kernels launch on the current device) and its
    current stream's handle; the device is switched only when it is not current already (the
    context manager costs host time on every call)."""
    if device.index is not None and device.index != torch.cuda.current_device():
        with torch.cuda.device(device):
            return fn(torch.cuda.current_stream(device).cuda_stream)
    return fn(torch.cuda.current_stream(device).cuda_stream)


# ----------------------------------------------------------------------------- kernels
def kernel_for(device: torch.device) -> str:
    """Which implementation :func:`pcsd_weights` uses on ``device``: 'cpu', 'cuda' or 'reference'."""
    c = _native.kernels()
    if c is None:
        return "reference"
    if device.type == "cpu":
        return "cpu"
    if device.type == "cuda" and hasattr(c, "pcsd_weights_cuda"):
        return "cuda"
    return "reference"


def _run(
    gap: Tensor,
    cu_seqlens: Tensor,
    mask: Optional[Tensor],
    out: Tensor,
    stats: Optional[list[Tensor]],
    n_min: int,
    n_max: int,
    alpha: float,
    tau_low: float,
    tau_high: float,
    gamma: float,
    beta_gate: float,
    eps_slope: float,
    eps_scale: float,
    adaptive: bool,
    trend: bool,
) -> None:
    """Fills ``out`` (and ``stats`` = [adaptive, r, slope, eta] when given) in place."""
    gap = gap.detach().contiguous()
    cu = cu_seqlens.detach().to(torch.int64).contiguous()
    which = kernel_for(gap.device)
    mask = None if mask is None else mask.detach()
    m8 = _mask_u8(mask, check=which != "reference")
    num_segments = cu.numel() - 1
    params = (n_min, n_max, alpha, tau_low, tau_high, gamma, beta_gate, eps_slope, eps_scale, adaptive, trend)
    ptrs = [0, 0, 0, 0] if stats is None else [t.data_ptr() for t in stats]
    if which == "cpu":
        c = _native.require("_C")
        status, where = c.pcsd_weights_cpu(
            gap.data_ptr(),
            cu.data_ptr(),
            num_segments,
            gap.numel(),
            0 if m8 is None else m8.data_ptr(),
            *params,
            out.data_ptr(),
            *ptrs,
            torch.get_num_threads(),
        )
        if status != 0:
            _raise_status(status, where, gap, cu)
        return
    if which == "cuda":  # the kernels validate; their verdict comes back in one transfer
        c = _native.require("_C")
        args = (gap.data_ptr(), cu.data_ptr(), num_segments, gap.numel(), 0 if m8 is None else m8.data_ptr())
        status, where = _cuda_call(
            gap.device, lambda stream: c.pcsd_weights_cuda(*args, *params, out.data_ptr(), *ptrs, stream, True)
        )
        if status != 0:
            _raise_status(status, where, gap, cu)
        return
    _check_data(gap, cu, mask)
    ref = pcsd_weights_reference(
        gap,
        cu,
        m8,
        n_min=n_min,
        n_max=n_max,
        alpha=alpha,
        tau_low=tau_low,
        tau_high=tau_high,
        gamma=gamma,
        beta_gate=beta_gate,
        eps_slope=eps_slope,
        eps_scale=eps_scale,
        adaptive=adaptive,
        trend=trend,
    )
    out.copy_(ref.w)
    if stats is not None:
        for dst, src in zip(stats, ref[1:]):
            dst.copy_(src)


@torch.library.custom_op("pcsd::pcsd_weights", mutates_args=())
def _op_weights(
    gap: Tensor,
    cu_seqlens: Tensor,
    mask: Optional[Tensor],
    n_min: int,
    n_max: int,
    alpha: float,
    tau_low: float,
    tau_high: float,
    gamma: float,
    beta_gate: float,
    eps_slope: float,
    eps_scale: float,
    adaptive: bool,
    trend: bool,
) -> Tensor:
    out = torch.empty_like(gap)
    _run(
        gap,
        cu_seqlens,
        mask,
        out,
        None,
        n_min,
        n_max,
        alpha,
        tau_low,
        tau_high,
        gamma,
        beta_gate,
        eps_slope,
        eps_scale,
        adaptive,
        trend,
    )
    return out


@_op_weights.register_fake
def _(
    gap,
    cu_seqlens,
    mask,
    n_min,
    n_max,
    alpha,
    tau_low,
    tau_high,
    gamma,
    beta_gate,
    eps_slope,
    eps_scale,
    adaptive,
    trend,
):
    return torch.empty_like(gap)


@torch.library.custom_op("pcsd::pcsd_weights_out", mutates_args=("out",))
def _op_weights_out(
    gap: Tensor,
    cu_seqlens: Tensor,
    mask: Optional[Tensor],
    out: Tensor,
    n_min: int,
    n_max: int,
    alpha: float,
    tau_low: float,
    tau_high: float,
    gamma: float,
    beta_gate: float,
    eps_slope: float,
    eps_scale: float,
    adaptive: bool,
    trend: bool,
) -> None:
    _run(
        gap,
        cu_seqlens,
        mask,
        out,
        None,
        n_min,
        n_max,
        alpha,
        tau_low,
        tau_high,
        gamma,
        beta_gate,
        eps_slope,
        eps_scale,
        adaptive,
        trend,
    )


@_op_weights_out.register_fake
def _(
    gap,
    cu_seqlens,
    mask,
    out,
    n_min,
    n_max,
    alpha,
    tau_low,
    tau_high,
    gamma,
    beta_gate,
    eps_slope,
    eps_scale,
    adaptive,
    trend,
):
    return None


@torch.library.custom_op("pcsd::pcsd_weights_stats", mutates_args=())
def _op_weights_stats(
    gap: Tensor,
    cu_seqlens: Tensor,
    mask: Optional[Tensor],
    n_min: int,
    n_max: int,
    alpha: float,
    tau_low: float,
    tau_high: float,
    gamma: float,
    beta_gate: float,
    eps_slope: float,
    eps_scale: float,
    adaptive: bool,
    trend: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    out = torch.empty_like(gap)
    stats = [torch.empty_like(gap) for _ in range(4)]
    _run(
        gap,
        cu_seqlens,
        mask,
        out,
        stats,
        n_min,
        n_max,
        alpha,
        tau_low,
        tau_high,
        gamma,
        beta_gate,
        eps_slope,
        eps_scale,
        adaptive,
        trend,
    )
    return out, stats[0], stats[1], stats[2], stats[3]


@_op_weights_stats.register_fake
def _(
    gap,
    cu_seqlens,
    mask,
    n_min,
    n_max,
    alpha,
    tau_low,
    tau_high,
    gamma,
    beta_gate,
    eps_slope,
    eps_scale,
    adaptive,
    trend,
):
    return tuple(torch.empty_like(gap) for _ in range(5))


# ----------------------------------------------------------------------------- public API
def _plain_eager(*tensors: Optional[Tensor]) -> bool:
    """Whether a call may skip the registered custom ops and run :func:`_run` itself: eager mode
    (not traced by ``torch.compile``, no Python dispatch mode such as ``FakeTensorMode``, no
    functorch transform) on plain CPU or CUDA tensors. The custom ops' dispatcher costs 0.1-0.2 ms
    of host time per call, longer than the kernel on most batches; where it is needed (tracing,
    fake tensors, other devices) the ops run as before, with the same ``_run`` inside."""
    if torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active():
        return False
    if torch.utils._python_dispatch._get_current_dispatch_mode() is not None:
        return False
    return all(t is None or (type(t) is Tensor and t.device.type in ("cpu", "cuda")) for t in tensors)


def pcsd_weights(
    gap: Tensor,
    cu_seqlens: Tensor,
    mask: Optional[Tensor] = None,
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
    out: Optional[Tensor] = None,
    return_stats: bool = False,
    adaptive: bool = True,
    trend: bool = True,
) -> Tensor | PcsdStats:
    """PCSD token weights for packed variable-length responses (see the module docstring).

    Args:
        gap: ``[T]`` float32 teacher - student sampled log-prob gaps (detached here).
        cu_seqlens: ``[S+1]`` int32/int64 segment offsets; a segment is one response turn.
        mask: ``[T]`` bool or float {0, 1} valid-token mask; None means all valid.
        n_min, n_max: short and long window sizes (1 <= n_min <= n_max).
        alpha: decay factor in (0, 1]; 1 gives uniform weights inside the windows.
        tau_low, tau_high: variance thresholds (tau_low < tau_high).
        gamma: negative-trend modulation strength (>= 0).
        beta_gate: sigmoid gate sharpness (>= 0).
        eps_slope, eps_scale: positive stabilisers of the slope and the response-level scale.
        out: optional preallocated float32 ``[T]`` output, written in place and returned.
        return_stats: also return the per-token ``adaptive``, ``r``, ``slope``, ``eta``.
        adaptive: False uses the decayed mean over the ``n_min`` window alone (r = 0): the
            fixed-window ablations.
        trend: False sets eta = 1: the no-trend ablation.

    Returns:
        ``w`` ``[T]`` float32 (``out`` when given), or :class:`PcsdStats` with ``return_stats``.

    Raises:
        ValueError: naming the argument, for a wrong dtype, rank, device or length, malformed
            ``cu_seqlens``, a non-finite gap at a valid position, or a parameter out of range.
    """
    _check_params(n_min, n_max, alpha, tau_low, tau_high, gamma, beta_gate, eps_slope, eps_scale)
    _check_tensors(gap, cu_seqlens, mask, out)
    args = (
        n_min,
        n_max,
        float(alpha),
        float(tau_low),
        float(tau_high),
        float(gamma),
        float(beta_gate),
        float(eps_slope),
        float(eps_scale),
        bool(adaptive),
        bool(trend),
    )
    gap = gap.detach()
    if _plain_eager(gap, cu_seqlens, mask, out):  # straight to the kernels: the same _run, no dispatcher
        w = out if out is not None else torch.empty_like(gap)
        stats = [torch.empty_like(gap) for _ in range(4)] if return_stats else None
        _run(gap, cu_seqlens, mask, w, stats, *args)
        return w if stats is None else PcsdStats(w, *stats)
    if return_stats:
        w, ad, r, slope, eta = _op_weights_stats(gap, cu_seqlens, mask, *args)
        if out is not None:
            out.copy_(w)
            w = out
        return PcsdStats(w, ad, r, slope, eta)
    if out is not None:
        _op_weights_out(gap, cu_seqlens, mask, out, *args)
        return out
    return _op_weights(gap, cu_seqlens, mask, *args)


def pcsd_weights_padded(gap: Tensor, mask: Tensor, **kwargs: Any) -> Tensor | PcsdStats:
    """Padded convenience form: ``gap`` and ``mask`` are ``[B, L]``, one response per row.

    Same numbers as :func:`pcsd_weights` on the packed form with the same mask (each row is one
    segment; padded positions must be masked). Returns ``[B, L]`` tensors.
    """
    if not isinstance(gap, Tensor) or gap.dim() != 2:
        raise ValueError(f"gap must be a 2-D [B, L] tensor, got {getattr(gap, 'shape', type(gap))}")
    if not isinstance(mask, Tensor) or mask.shape != gap.shape:
        raise ValueError(
            f"mask must be a tensor of gap's shape {tuple(gap.shape)}, got {getattr(mask, 'shape', type(mask))}"
        )
    if "out" in kwargs:
        raise ValueError("out is not supported by pcsd_weights_padded; use the packed form")
    b, length = gap.shape
    cu = torch.arange(b + 1, device=gap.device, dtype=torch.int64) * length
    res = pcsd_weights(gap.reshape(-1), cu, mask.reshape(-1), **kwargs)
    if isinstance(res, PcsdStats):
        return PcsdStats(*(t.view(b, length) for t in res))
    return res.view(b, length)
