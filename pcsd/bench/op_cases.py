"""The PCSD-weights op's self-test cases, shared by ``tools/cuda_selftest.py`` and ``python -m
pcsd.bench gpu``: random varlen batches (segment lengths 0..600, empty and length-1 segments, random
masks with holes and fully masked segments, NaN/Inf garbage at masked positions, per-segment
magnitudes 1e-3..1e3, constant runs, trends, a long segment spanning many 2048-token tiles, tile-sized
segments, unaligned views) run through one implementation and compared with a reference under
magnitude-scaled tolerances.

Implementations: :func:`run_cuda` (``pcsd._C.pcsd_weights_cuda`` on torch CUDA tensors' addresses and
the current stream, with guard sentinels around every output), :func:`run_cpu` (the CPU kernel
``pcsd._C.pcsd_weights_cpu``, fp64 accumulation: the reference of the CUDA kernel) and
:func:`run_reference` (the plain torch reference :func:`pcsd.ops.reference.pcsd_weights_reference`
in float64: the reference of the CPU kernel where there is no GPU).

Tolerances (:func:`compare`): ``|dw| <= 1e-5 |w| + 1e-6`` plus terms for the fp32 conditioning of the
sigmoid/eta inputs (the CUDA kernel accumulates in fp32, so the absolute error of the decayed mean is
~1e-6 x the window's magnitude, and the sigmoid multiplies it by beta/4); adaptive / r / slope /
eta with tolerances scaled by the segment magnitude; ``w == 0`` exactly at masked positions.
:func:`bandwidth` times the CUDA op against a device-to-device copy of the same bytes.
"""

from __future__ import annotations

import math
import time
from dataclasses import astuple, dataclass, field
from typing import Any, Callable, Optional

import numpy as np
import torch

from pcsd.ops.defaults import PcsdDefaults

__all__ = [
    "Params",
    "Batch",
    "PARAM_SETS",
    "make_batch",
    "unmasked",
    "run_cpu",
    "run_cuda",
    "run_reference",
    "compare",
    "cases",
    "api_accepts",
    "correctness",
    "bandwidth",
]


def _c():
    from pcsd import _native

    return _native.require("_C")


@dataclass(frozen=True)
class Params(PcsdDefaults):
    """The op's arguments: PCSD's parameters (defaults: :mod:`pcsd.ops.defaults`) and the two switches."""

    adaptive: bool = True
    trend: bool = True

    def args(self) -> tuple:
        """The kernels' positional arguments: the nine parameters in their order, adaptive, trend."""
        return astuple(self)


@dataclass
class Batch:
    gap: np.ndarray  # float32 [T]
    mask: np.ndarray  # uint8 [T]
    cu: np.ndarray  # int64 [S + 1]
    seg_mag: np.ndarray = field(default_factory=lambda: np.zeros(0))  # per token: max |g| valid
    clean: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))  # gap before garbage


def make_batch(rng: np.random.Generator, lengths: list[int], hole_rate: float = 0.15) -> Batch:
    lengths = [int(x) for x in lengths]
    cu = np.zeros(len(lengths) + 1, dtype=np.int64)
    cu[1:] = np.cumsum(lengths)
    total = int(cu[-1])
    gap = np.empty(total, dtype=np.float32)
    mask = np.ones(total, dtype=np.uint8)
    for s, n in enumerate(lengths):
        if n == 0:
            continue
        a = int(cu[s])
        mag = 10.0 ** rng.uniform(-3, 3)
        kind = rng.integers(0, 5)
        x = rng.normal(0.0, mag, n)
        if kind == 1:  # large common offset, small spread (stresses the centred moments)
            x = mag * (1.0 + 1e-3 * rng.normal(size=n))
        elif kind == 2:  # constant runs
            pos = 0
            while pos < n:
                run = int(rng.integers(1, 40))
                x[pos : pos + run] = rng.normal(0.0, mag) if rng.random() < 0.5 else x[pos]
                pos += run
        elif kind == 3:  # smooth trend (negative slopes hit eta)
            x = mag * (np.linspace(1.0, -1.0, n) + 0.1 * rng.normal(size=n))
        gap[a : a + n] = x.astype(np.float32)
        m = np.ones(n, dtype=np.uint8)
        if rng.random() < 0.05:
            m[:] = 0  # fully masked segment
        else:
            pos = 0
            while pos < n:  # masked holes of random length
                if rng.random() < hole_rate:
                    h = int(rng.integers(1, 12))
                    m[pos : pos + h] = 0
                    pos += h
                pos += int(rng.integers(1, 30))
        mask[a : a + n] = m
    clean = gap.copy()
    # Garbage at masked positions: the kernels must never read it into a sum.
    bad = np.flatnonzero(mask == 0)
    if bad.size:
        gap[bad] = rng.choice(np.array([np.nan, np.inf, -np.inf, 1e30], dtype=np.float32), bad.size)
    return Batch(gap, mask, cu, seg_magnitude(gap, mask, cu), clean)


def seg_magnitude(gap: np.ndarray, mask: np.ndarray, cu: np.ndarray) -> np.ndarray:
    """Per token: the largest |g| over the valid tokens of its segment."""
    out = np.zeros(gap.size, dtype=np.float64)
    for s in range(cu.size - 1):
        a, b = int(cu[s]), int(cu[s + 1])
        if b > a:
            v = np.abs(gap[a:b][mask[a:b] != 0].astype(np.float64))
            out[a:b] = v.max() if v.size else 0.0
    return out


def unmasked(b: Batch) -> Batch:
    """The same segments with every token valid (masked garbage replaced by the clean values)."""
    ones = np.ones_like(b.mask)
    return Batch(b.clean.copy(), ones, b.cu, seg_magnitude(b.clean, ones, b.cu), b.clean.copy())


def run_cpu(b: Batch, p: Params, use_mask: bool = True) -> dict[str, np.ndarray]:
    T = b.gap.size
    gap = torch.from_numpy(b.gap.copy())
    cu = torch.from_numpy(b.cu.copy())
    mask = torch.from_numpy(b.mask.copy())
    out = {k: torch.empty(T, dtype=torch.float32) for k in ("w", "ad", "r", "slope", "eta")}
    status, where = _c().pcsd_weights_cpu(
        gap.data_ptr(),
        cu.data_ptr(),
        b.cu.size - 1,
        T,
        mask.data_ptr() if use_mask else 0,
        *p.args(),
        out["w"].data_ptr(),
        out["ad"].data_ptr(),
        out["r"].data_ptr(),
        out["slope"].data_ptr(),
        out["eta"].data_ptr(),
        0,
    )
    if status != 0:
        raise RuntimeError(f"CPU kernel status {status} at {where}")
    return {k: v.numpy() for k, v in out.items()}


GUARD = 64
SENTINEL = 12345.0


def run_cuda(b: Batch, p: Params, use_mask: bool = True, stats: bool = True, offset: int = 0) -> dict[str, np.ndarray]:
    """offset > 0 places every buffer at a non-16-byte-aligned address (scalar code paths)."""
    T = b.gap.size
    dev = torch.device("cuda")
    gbuf = torch.zeros(T + offset + 1, dtype=torch.float32, device=dev)
    gbuf[offset : offset + T] = torch.from_numpy(b.gap).to(dev)
    mbuf = torch.zeros(T + offset + 1, dtype=torch.uint8, device=dev)
    mbuf[offset : offset + T] = torch.from_numpy(b.mask).to(dev)
    cu = torch.from_numpy(b.cu).to(dev)
    outs = {
        k: torch.full((T + offset + GUARD,), SENTINEL, dtype=torch.float32, device=dev)
        for k in ("w", "ad", "r", "slope", "eta")
    }

    def ptr(t: torch.Tensor, elem: int) -> int:
        return t.data_ptr() + offset * elem

    stat_ptrs = [ptr(outs[k], 4) if stats else 0 for k in ("ad", "r", "slope", "eta")]
    _c().pcsd_weights_cuda(
        ptr(gbuf, 4),
        cu.data_ptr(),
        b.cu.size - 1,
        T,
        ptr(mbuf, 1) if use_mask else 0,
        *p.args(),
        ptr(outs["w"], 4),
        *stat_ptrs,
        torch.cuda.current_stream().cuda_stream,
    )
    torch.cuda.synchronize()
    res = {}
    for k, t in outs.items():
        h = t.cpu().numpy()
        if not (h[:offset] == SENTINEL).all() or not (h[offset + T :] == SENTINEL).all():
            raise AssertionError(f"{k}: the CUDA kernel wrote outside [0, T)")
        if not stats and k != "w" and not (h == SENTINEL).all():
            raise AssertionError(f"{k}: written although its pointer was null")
        res[k] = h[offset : offset + T]
    return res


def run_reference(b: Batch, p: Params, use_mask: bool = True) -> dict[str, np.ndarray]:
    """The plain torch reference in float64 (the oracle of the CPU kernel)."""
    from pcsd.ops.reference import pcsd_weights_reference

    gap = torch.from_numpy(b.gap.astype(np.float64))
    mask = torch.from_numpy(b.mask != 0) if use_mask else None
    st = pcsd_weights_reference(
        gap,
        torch.from_numpy(b.cu.copy()),
        mask,
        n_min=p.n_min,
        n_max=p.n_max,
        alpha=p.alpha,
        tau_low=p.tau_low,
        tau_high=p.tau_high,
        gamma=p.gamma,
        beta_gate=p.beta_gate,
        eps_slope=p.eps_slope,
        eps_scale=p.eps_scale,
        adaptive=p.adaptive,
        trend=p.trend,
    )
    return {k: v.numpy() for k, v in zip(("w", "ad", "r", "slope", "eta"), st)}


def segment_scale(b: Batch, use_mask: bool, eps: float) -> np.ndarray:
    T = b.gap.size
    out = np.zeros(T)
    for s in range(b.cu.size - 1):
        a, z = int(b.cu[s]), int(b.cu[s + 1])
        if z > a:
            v = b.gap[a:z].astype(np.float64)
            if use_mask:
                v = v[b.mask[a:z] != 0]
            out[a:z] = (np.abs(v).mean() if v.size else 0.0) + eps
    return out


def compare(
    name: str, b: Batch, p: Params, ref: dict, got: dict, use_mask: bool, log: Optional[Callable[[str], None]] = print
) -> list[str]:
    """The differences of ``got`` from ``ref`` beyond the tolerances (module doc), one line each;
    ``log`` gets one summary line per case."""
    errs = []
    M = b.seg_mag
    scale = segment_scale(b, use_mask, p.eps_scale)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(scale > 0, M / scale, 0.0)
    tol_ad = 1e-5 * M + 1e-6
    tol_slope = 1e-5 * (M + np.abs(ref["slope"])) + 1e-6
    tol_eta = 1e-5 + p.gamma * 1e-5 * (ratio + np.abs(ref["slope"]) / np.maximum(scale, 1e-30))
    tol_r = 1e-5 + 1e-5 * M * M / (p.tau_high - p.tau_low)
    tol_w = 1e-5 * np.abs(ref["w"]) + 1e-6 + 0.25 * abs(p.beta_gate) * tol_ad + tol_eta
    tols = {"w": tol_w, "ad": tol_ad, "r": tol_r, "slope": tol_slope, "eta": tol_eta}
    for k, tol in tols.items():
        d = np.abs(got[k].astype(np.float64) - ref[k].astype(np.float64))
        bad = ~(d <= tol)  # also catches NaN
        both_nan = np.isnan(got[k]) & np.isnan(ref[k])
        bad &= ~both_nan
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            errs.append(
                f"{name}: {k} differs at {int(bad.sum())} of {bad.size} tokens; first i={i}:"
                f" cuda={got[k][i]!r} cpu={ref[k][i]!r} tol={tol[i]:.3g}"
            )
    if use_mask:
        masked = b.mask == 0
        if (got["w"][masked] != 0).any():
            errs.append(f"{name}: w is not exactly 0 at masked positions")
    strict = np.abs(got["w"] - ref["w"]) <= 1e-5 * np.abs(ref["w"]) + 1e-6
    log and log(
        f"  {name:<48} T={b.gap.size:>8}  max|dw|={np.abs(got['w'] - ref['w']).max(initial=0):.2e}"
        f"  strict-1e-5 pass={strict.mean() if strict.size else 1.0:.6f}"
        f"  {'OK' if not errs else 'FAIL'}"
    )
    return errs


PARAM_SETS = [
    ("default n=1..8", Params()),
    ("n=1..1", Params(n_min=1, n_max=1)),
    ("n=3..8 alpha=1", Params(n_min=3, n_max=8, alpha=1.0)),
    ("n=8..8 alpha=0", Params(n_min=8, n_max=8, alpha=0.0)),
    ("n=2..5 (padded CAP 8)", Params(n_min=2, n_max=5)),
    ("n=2..16", Params(n_min=2, n_max=16)),
    ("n=4..12 (padded CAP 16)", Params(n_min=4, n_max=12)),
    ("n=4..32", Params(n_min=4, n_max=32)),
    ("n=1..20 (padded CAP 32)", Params(n_min=1, n_max=20)),
    ("n=8..64 general", Params(n_min=8, n_max=64)),
    ("n=1..40 general", Params(n_min=1, n_max=40)),
    ("n_min > n_max", Params(n_min=12, n_max=6)),
    ("adaptive off", Params(adaptive=False)),
    ("trend off", Params(trend=False)),
    ("both off", Params(adaptive=False, trend=False)),
    ("both off, n_max=1", Params(n_max=1, adaptive=False, trend=False)),
    ("eps_scale=0 gamma=2", Params(eps_scale=0.0, gamma=2.0)),
]


SMALL_PARAM_SETS = ("default n=1..8", "n=1..1", "n=2..16", "n=8..64 general", "adaptive off", "trend off")


def cases(level: str = "full", seed: int = 1234) -> list[tuple[str, Batch, list[tuple[str, Params]]]]:
    """``(name, batch, parameter sets)``: random varlen batches with every parameter set, and the
    edge shapes with every set. ``level``: ``full`` (5 random batches), ``quick`` (2, the edge
    shapes with the first three sets) or ``small`` (1 random batch of up to 60 segments with
    :data:`SMALL_PARAM_SETS`, the edge shapes with the default set: for a slow reference)."""
    if level not in ("full", "quick", "small"):
        raise ValueError(f"level must be full, quick or small, got {level!r}")
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range({"full": 5, "quick": 2, "small": 1}[level]):
        S = int(rng.integers(1, 60 if level == "small" else 200))
        lengths = rng.integers(0, 601, S)
        lengths[rng.random(S) < 0.1] = 0
        lengths[rng.random(S) < 0.1] = 1
        batches.append(("random varlen", make_batch(rng, list(lengths))))
    batches.append(("many tiny segments", make_batch(rng, list(rng.integers(0, 4, 3000)))))
    batches.append(("long segment (many tiles)", make_batch(rng, [5, 70001, 0, 3, 9000], 0.02)))
    batches.append(("single token", make_batch(rng, [1])))
    batches.append(("all empty but one", make_batch(rng, [0, 0, 0, 17, 0, 0])))
    batches.append(("tile-sized segments", make_batch(rng, [2048, 2048, 2047, 2049, 1, 4095])))
    small = [ps for ps in PARAM_SETS if ps[0] in SMALL_PARAM_SETS]
    edge = {"full": PARAM_SETS, "quick": PARAM_SETS[:3], "small": PARAM_SETS[:1]}[level]
    return [
        (name, b, (small if level == "small" else PARAM_SETS) if name == "random varlen" else edge)
        for name, b in batches
    ]


def api_accepts(p: Params) -> bool:
    """Whether :func:`pcsd.ops.kernels.pcsd_weights` accepts these parameters (the raw kernels also
    take e.g. ``eps_scale=0``, outside the reference's domain)."""
    from pcsd.ops.kernels import check_pcsd_params

    try:
        check_pcsd_params(
            n_min=p.n_min,
            n_max=p.n_max,
            alpha=p.alpha,
            tau_low=p.tau_low,
            tau_high=p.tau_high,
            gamma=p.gamma,
            beta_gate=p.beta_gate,
            eps_slope=p.eps_slope,
            eps_scale=p.eps_scale,
        )
    except ValueError:
        return False
    return True


Impl = Callable[..., dict]


def correctness(
    level: str = "full", impl: Impl = run_cuda, ref: Impl = run_cpu, log: Optional[Callable[[str], None]] = print
) -> tuple[int, list[str]]:
    """Runs the :func:`cases` of ``level`` through ``impl`` and ``ref`` (masked and unmasked; with
    :func:`run_reference` only the parameters the public API accepts); for the CUDA kernel also
    bitwise determinism, the w-only launch, unaligned buffers and an empty input. Returns the
    number of comparisons and the failures."""
    errs: list[str] = []
    n = 0
    cuda = impl is run_cuda
    for bname, b, psets in cases(level):
        for pname, p in psets:
            if ref is run_reference and not api_accepts(p):
                continue
            for use_mask in (True, False):
                # mask == nullptr: every position must hold a finite gap, so use the clean copy.
                bb = b if use_mask else unmasked(b)
                want = ref(bb, p, use_mask)
                got = impl(bb, p, use_mask)
                label = f"{bname} | {pname} | {'mask' if use_mask else 'no mask'}"
                errs += compare(label, bb, p, want, got, use_mask, log)
                n += 1
                if not cuda:
                    continue
                again = run_cuda(bb, p, use_mask)
                for k in got:
                    if not np.array_equal(got[k], again[k], equal_nan=True):
                        errs.append(f"{label}: {k} not bitwise identical across two runs")
                w_only = run_cuda(bb, p, use_mask, stats=False)
                if not np.allclose(w_only["w"], got["w"], rtol=1e-6, atol=1e-7, equal_nan=True):
                    errs.append(f"{label}: w differs between the w-only and the stats launch")
        if cuda:  # unaligned buffers (scalar load/store paths)
            p = Params()
            errs += compare(
                f"{bname} | default | unaligned", b, p, ref(b, p, True), run_cuda(b, p, True, offset=1), True, log
            )
            n += 1
    if cuda:  # empty input: nothing to do, must not fail
        run_cuda(Batch(np.zeros(0, np.float32), np.zeros(0, np.uint8), np.zeros(4, np.int64)), Params())
    return n, errs


def bandwidth(total: int, use_mask: bool, device: str = "cuda", iters: int = 50) -> dict[str, Any]:
    """The op on ``total`` tokens of agent-like turns (1..2000 tokens, a masked observation run in a
    third of them) against a copy of the same bytes on ``device``: the kernel called as the
    self-test calls it (addresses, weights only, scratch included) and the public
    :func:`pcsd.ops.kernels.pcsd_weights` (its checks and mask conversion included).

    Returns seconds per call (``kernel_s``, ``api_s``, ``copy_s``), ``kernel_GBps`` (gap + mask read,
    w written: 9 B/token, 8 without a mask), ``copy_GBps`` (read + written), and the bandwidth
    ratios ``kernel_vs_copy`` and ``api_vs_copy``. CUDA: best of 5 rounds of ``iters`` calls between
    CUDA events; CPU: best of 5 calls."""
    from pcsd.ops.kernels import pcsd_weights

    rng = np.random.default_rng(7)
    lengths: list[int] = []
    while sum(lengths) < total:
        lengths.append(int(rng.integers(1, 2001)))
    lengths[-1] -= sum(lengths) - total
    dev = torch.device(device)
    cu = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)).to(dev)
    gap = torch.randn(total, device=dev)
    m = np.ones(total, dtype=np.uint8)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    for a0, n in zip(starts, lengths):
        if n > 60 and rng.random() < 0.3:
            h0 = int(a0 + rng.integers(0, n - 50))
            m[h0 : h0 + int(rng.integers(5, 50))] = 0
    mask8 = torch.from_numpy(m).to(dev)
    mask = mask8.bool() if use_mask else None
    w = torch.empty(total, device=dev)
    nbytes = total * (4 + (1 if use_mask else 0) + 4)
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    args = (
        gap.data_ptr(),
        cu.data_ptr(),
        len(lengths),
        total,
        mask8.data_ptr() if use_mask else 0,
        *Params().args(),
        w.data_ptr(),
        0,
        0,
        0,
        0,
    )

    def kernel() -> None:
        if dev.type == "cuda":
            _c().pcsd_weights_cuda(*args, torch.cuda.current_stream().cuda_stream)
        else:
            _c().pcsd_weights_cpu(*args, torch.get_num_threads())

    def time_it(fn) -> float:
        for _ in range(3):
            fn()
        best = math.inf
        if dev.type != "cuda":
            for _ in range(5):
                t0 = time.perf_counter()
                fn()
                best = min(best, time.perf_counter() - t0)
            return best
        torch.cuda.synchronize()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(5):
            start.record()
            for _ in range(iters):
                fn()
            stop.record()
            stop.synchronize()
            best = min(best, start.elapsed_time(stop) / iters * 1e-3)
        return best

    t_k = time_it(kernel)
    t_api = time_it(lambda: pcsd_weights(gap, cu, mask, out=w))
    t_c = time_it(lambda: dst.copy_(src))
    copy_bw = 2 * src.numel() / t_c
    extra: dict[str, dict[str, float]] = {}
    if dev.type == "cuda":
        extra["kernel_breakdown_us"] = kernel_breakdown(kernel)
        extra["api_breakdown_us"] = kernel_breakdown(lambda: pcsd_weights(gap, cu, mask, out=w))
    return dict(
        **extra,
        tokens=total,
        mask=use_mask,
        kernel_s=t_k,
        api_s=t_api,
        copy_s=t_c,
        kernel_GBps=nbytes / t_k / 1e9,
        copy_GBps=copy_bw / 1e9,
        kernel_vs_copy=nbytes / t_k / copy_bw,
        api_vs_copy=nbytes / t_api / copy_bw,
        api_vs_kernel=t_api / t_k,
    )


def kernel_breakdown(fn, iters: int = 20) -> dict[str, float]:
    """Device microseconds per call of each kernel (and memset/memcpy) that ``fn`` launches, from
    torch's profiler (CUPTI sees the extension's kernels too): which launch costs what, for the next
    step on the op's bandwidth. Empty when the profiler cannot run."""
    try:
        from torch.profiler import ProfilerActivity, profile

        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(iters):
                fn()
            torch.cuda.synchronize()
        out: dict[str, float] = {}
        for e in prof.key_averages():
            t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0) or 0
            if t > 0:
                name = e.key.split("(")[0].split("::")[-1][:60]
                out[name] = out.get(name, 0.0) + t / iters
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))
    except Exception as exc:  # a profiler without CUPTI, an older torch
        return {"unavailable": float("nan"), type(exc).__name__: float("nan")}
