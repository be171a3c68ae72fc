"""The PCSD weights op: native kernel vs the PyTorch reference vs the literal loop, the paper's
appendix facts, custom-op plumbing (opcheck, torch.compile), the loss, and bad input."""

from __future__ import annotations

import contextlib
import math
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pcsd import _native
from pcsd.ops.kernels import kernel_for, pcsd_weights, pcsd_weights_padded
from pcsd.ops.losses import pcsd_loss
from pcsd.ops.reference import pcsd_weights_loop, pcsd_weights_reference

HAVE_C = _native.kernels() is not None
needs_c = pytest.mark.skipif(not HAVE_C, reason="pcsd._C not built (run tools/build_inplace.sh)")
FIELDS = ("w", "adaptive", "r", "slope", "eta")
HAVE_AVX2 = HAVE_C and bool(_native.kernels().build_info().get("cpu_avx2"))
# Every CPU implementation this machine can run: the portable scalar kernel always, the AVX2+FMA
# kernel where the CPU has it. Tests parametrised over IMPLS check each one against the reference.
IMPLS = ["scalar"] + (["avx2"] if HAVE_AVX2 else [])


@contextlib.contextmanager
def cpu_impl(name):
    """Force the CPU implementation (the binding reads PCSD_CPU_KERNEL on every call)."""
    old = os.environ.get("PCSD_CPU_KERNEL")
    os.environ["PCSD_CPU_KERNEL"] = name
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PCSD_CPU_KERNEL", None)
        else:
            os.environ["PCSD_CPU_KERNEL"] = old


def ran_kernel(n_min=1, n_max=8, alpha=0.8):
    """The CPU implementation a call with these window parameters runs now."""
    return _native.kernels().cpu_kernel(n_min, n_max, alpha)


def make_batch(lengths, seed, mask_p=0.2, log_mag=0.0, const_runs=False, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    gap = torch.randn(total, generator=g, dtype=torch.float64) * (10.0**log_mag)
    if const_runs and total:
        # Overwrite random stretches with a constant: zero variance and zero slope windows.
        for _ in range(max(1, total // 50)):
            a = int(torch.randint(0, total, (1,), generator=g))
            b = min(total, a + int(torch.randint(1, 30, (1,), generator=g)))
            gap[a:b] = gap[a]
    mask = torch.rand(total, generator=g) >= mask_p
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int64)
    return gap.float().to(device), cu.to(device), mask.to(device)


def assert_close_to_ref(got, gap, cu, mask, **kw):
    """|kernel - ref64| <= 2 |ref32 - ref64| + atol, per field (flash-attention's rule)."""
    ref64 = pcsd_weights_reference(gap.double(), cu, mask, **kw)
    ref32 = pcsd_weights_reference(gap, cu, mask, **kw)
    for name, k, r64, r32 in zip(FIELDS, got, ref64, ref32):
        bound = 2 * (r32.double() - r64).abs() + 1e-6 * (1 + r64.abs())
        err = (k.double() - r64).abs()
        bad = err > bound
        assert not bool(bad.any()), (
            f"{name}: {int(bad.sum())} positions off, worst err {float(err.max()):.3g} at "
            f"{int(err.argmax())} (bound there {float(bound[err.argmax()]):.3g})"
        )


# ----------------------------------------------------------------------------- equivalences
@needs_c
@pytest.mark.parametrize("impl", IMPLS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.integers(0, 600), min_size=1, max_size=6),
    seed=st.integers(0, 2**31 - 1),
    mask_p=st.sampled_from([0.0, 0.1, 0.5, 0.95]),
    log_mag=st.sampled_from([-3.0, -1.0, 0.0, 1.0, 3.0]),
    const_runs=st.booleans(),
    n_min=st.integers(1, 4),
    extra=st.integers(0, 12),
    alpha=st.sampled_from([0.5, 0.8, 1.0]),
    flags=st.sampled_from([(True, True), (False, True), (True, False)]),
)
def test_kernel_matches_reference(impl, lengths, seed, mask_p, log_mag, const_runs, n_min, extra, alpha, flags):
    gap, cu, mask = make_batch(lengths, seed, mask_p, log_mag, const_runs)
    kw = dict(n_min=n_min, n_max=n_min + extra, alpha=alpha, adaptive=flags[0], trend=flags[1])
    with cpu_impl(impl):
        assert ran_kernel(n_min, n_min + extra, alpha) == impl
        got = pcsd_weights(gap, cu, mask, return_stats=True, **kw)
        # the w-only and out= entry points run the kernel without statistics: same weights
        w_only = pcsd_weights(gap, cu, mask, **kw)
        out = torch.full_like(gap, float("nan"))
        pcsd_weights(gap, cu, mask, out=out, **kw)
        no_mask = pcsd_weights(gap, cu, None, return_stats=True, **kw)
    assert kernel_for(gap.device) == "cpu"
    assert_close_to_ref(got, gap, cu, mask, **kw)
    assert_close_to_ref(no_mask, gap, cu, None, **kw)
    torch.testing.assert_close(w_only, got.w, rtol=0, atol=0)
    torch.testing.assert_close(out, got.w, rtol=0, atol=0)


def test_reference_matches_literal_loop():
    for seed in range(5):
        gap, cu, mask = make_batch([0, 1, 2, 7, 30, 13], seed, mask_p=0.3)
        for kw in (
            dict(),
            dict(n_min=2, n_max=5, alpha=1.0),
            dict(adaptive=False, n_min=4),
            dict(trend=False, tau_low=0.0, tau_high=0.1),
        ):
            ref = pcsd_weights_reference(gap.double(), cu, mask, **kw).w
            loop = pcsd_weights_loop(gap.double().tolist(), cu.tolist(), mask.tolist(), **kw)
            torch.testing.assert_close(ref, torch.tensor(loop, dtype=torch.float64), rtol=1e-12, atol=1e-12)


@needs_c
def test_packed_equals_padded_and_int32_offsets():
    lengths = [5, 0, 17, 1, 40]
    gap, cu, mask = make_batch(lengths, 3, mask_p=0.25)
    packed = pcsd_weights(gap, cu.to(torch.int32), mask)
    big = max(lengths)
    pg = torch.zeros(len(lengths), big)
    pm = torch.zeros(len(lengths), big, dtype=torch.bool)
    for i, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        pg[i, : b - a] = gap[a:b]
        pm[i, : b - a] = mask[a:b]
    padded = pcsd_weights_padded(pg, pm)
    for i, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        torch.testing.assert_close(padded[i, : b - a], packed[a:b], rtol=0, atol=0)
        assert bool((padded[i, b - a :] == 0).all())


@needs_c
def test_float_mask_and_bool_mask_agree_and_out_is_written_in_place():
    gap, cu, mask = make_batch([30, 31], 7, mask_p=0.3)
    out = torch.full_like(gap, 7.0)
    res = pcsd_weights(gap, cu, mask.float(), out=out)
    assert res.data_ptr() == out.data_ptr()
    torch.testing.assert_close(out, pcsd_weights(gap, cu, mask), rtol=0, atol=0)
    st_ = pcsd_weights(gap, cu, mask, out=torch.empty_like(gap), return_stats=True)
    torch.testing.assert_close(st_.w, out, rtol=0, atol=0)


@needs_c
@pytest.mark.parametrize("impl", IMPLS)
def test_multithreaded_equals_single_threaded(impl):
    gap, cu, mask = make_batch([257] * 300, 11, mask_p=0.1)
    old = torch.get_num_threads()
    try:
        with cpu_impl(impl):
            torch.set_num_threads(1)
            one = pcsd_weights(gap, cu, mask)
            torch.set_num_threads(max(2, old))
            many = pcsd_weights(gap, cu, mask)
    finally:
        torch.set_num_threads(old)
    torch.testing.assert_close(one, many, rtol=0, atol=0)


def test_reference_fallback_when_native_missing(monkeypatch):
    gap, cu, mask = make_batch([20, 9], 5, mask_p=0.2)
    monkeypatch.setattr(_native, "kernels", lambda: None)
    assert kernel_for(gap.device) == "reference"
    got = pcsd_weights(gap, cu, mask, return_stats=True)
    assert_close_to_ref(got, gap, cu, mask)
    with pytest.raises(ValueError, match="cu_seqlens"):
        pcsd_weights(gap, cu.flip(0), mask)


@needs_c
@pytest.mark.skipif(not HAVE_AVX2, reason="CPU without AVX2/FMA: only the scalar kernel runs")
def test_auto_dispatch_picks_avx2_and_falls_back_for_long_windows():
    with cpu_impl("auto"):
        assert ran_kernel(1, 8, 0.8) == "avx2"
        assert ran_kernel(4, 32, 0.8) == "avx2"
        assert ran_kernel(1, 33, 0.8) == "scalar"  # long windows: the O(1) sliding scalar kernel
        assert ran_kernel(1, 8, 1e-5) == "scalar"  # alpha^j would leave the normal float range
    with cpu_impl("avx2"):  # forcing avx2 still takes the scalar kernel where avx2 does not apply
        assert ran_kernel(1, 40, 0.8) == "scalar"
    with cpu_impl("scalar"):
        assert ran_kernel(1, 8, 0.8) == "scalar"
    os.environ.pop("PCSD_CPU_KERNEL", None)
    assert ran_kernel(1, 8, 0.8) == "avx2"  # the default is auto


@needs_c
def test_unknown_cpu_kernel_name_raises_value_error():
    gap, cu, mask = make_batch([10], 0)
    with cpu_impl("sse9"), pytest.raises(ValueError, match="PCSD_CPU_KERNEL must be one of auto, scalar, avx2"):
        pcsd_weights(gap, cu, mask)
    with pytest.raises(ValueError, match="impl must be one of"):
        _native.kernels().cpu_kernel(1, 8, 0.8, "fast")


# Segment lengths around the AVX2 kernel's vector width (8), its chunk (2048 tokens) and window
# reach, empty segments, and every window combination of the weighting rules.
EDGE_LENGTHS = [0, 1, 2, 7, 8, 9, 15, 16, 17, 23, 0, 31, 33, 2040, 2047, 2048, 2049, 2055, 2056, 2057, 4096 + 13, 3, 0]
WINDOWS = [
    dict(),
    dict(n_min=1, n_max=1),
    dict(n_min=4, n_max=4),
    dict(n_min=2, n_max=16),
    dict(n_min=3, n_max=11, alpha=0.5),
    dict(n_min=1, n_max=32, alpha=0.9),
    dict(n_min=5, n_max=45),
    dict(adaptive=False, n_min=1),
    dict(adaptive=False, n_min=4),
    dict(trend=False),
    dict(alpha=1.0),
    dict(beta_gate=0.0),
    dict(gamma=5.0, eps_slope=1e-9),
]


@needs_c
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("kw", WINDOWS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "default")
def test_kernel_matches_reference_on_edge_lengths(impl, kw):
    for seed, (mask_p, log_mag, const_runs) in enumerate(
        [(0.0, 0.0, False), (0.3, 0.0, True), (0.05, 3.0, False), (0.5, -3.0, True), (1.0, 0.0, False)]
    ):
        gap, cu, mask = make_batch(EDGE_LENGTHS, seed, mask_p, log_mag, const_runs)
        if const_runs:  # whole constant segments, one with a large offset
            gap[cu[13] : cu[14]] = 1234.5
            gap[cu[3] : cu[4]] = -0.25
        with cpu_impl(impl):
            got = pcsd_weights(gap, cu, mask, return_stats=True, **kw)
        assert_close_to_ref(got, gap, cu, mask, **kw)


# The AVX2 kernel takes the 8 windows of a vector from per-call constants when their n_max + 7
# tokens hold at most one hole (a masked token, or the segment end) and forms the mask sums
# otherwise. A single masked token at every position of segments whose ends fall on every lane
# puts each hole position through each path. n_max = 2 leaves a window with one valid token
# (slope 0), n_max = 1 none; a negative tau_low makes r > 0 for any window with a valid token.
ONE_HOLE_WINDOWS = [
    dict(),
    dict(n_min=1, n_max=2),
    dict(n_min=3, n_max=8),
    dict(n_min=1, n_max=4),
    dict(n_min=2, n_max=11, alpha=0.5),
    dict(n_min=1, n_max=16),
    dict(tau_low=-0.2, tau_high=0.3),
    dict(n_min=1, n_max=1, tau_low=-0.2, tau_high=0.3),
    dict(adaptive=False, n_min=4),
]


@needs_c
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "kw", ONE_HOLE_WINDOWS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "default"
)
def test_kernel_matches_reference_with_one_hole_anywhere(impl, kw):
    n = kw.get("n_max", 8)
    lengths, masks = [], []
    for length in range(n + 16, n + 24):
        for hole in range(-1, length):  # -1: no hole
            lengths.append(length)
            m = torch.ones(length, dtype=torch.bool)
            if hole >= 0:
                m[hole] = False
            masks.append(m)
    g = torch.Generator().manual_seed(n)
    gap = torch.randn(sum(lengths), generator=g) * 0.5 - 0.2  # variances around tau
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int64)
    mask = torch.cat(masks)
    with cpu_impl(impl):
        got = pcsd_weights(gap, cu, mask, return_stats=True, **kw)
    assert_close_to_ref(got, gap, cu, mask, **kw)


@needs_c
@pytest.mark.skipif(not HAVE_AVX2, reason="CPU without AVX2/FMA")
def test_avx2_and_scalar_kernels_agree_on_a_large_batch():
    from pcsd.bench.op import make_segments

    gap, cu, mask = make_segments(300_000, seed=4)
    with cpu_impl("scalar"):
        ref = pcsd_weights(gap, cu, mask, return_stats=True)
    with cpu_impl("avx2"):
        got = pcsd_weights(gap, cu, mask, return_stats=True)
    # both are within float32 rounding of the exact values: compare with a forward-error tolerance
    for name, a, b in zip(FIELDS, got, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=name)


@needs_c
@pytest.mark.parametrize("impl", IMPLS)
def test_first_nonfinite_gap_is_reported(impl):
    # positions in a vector body, in a segment tail, and a masked NaN before the valid one
    for pos in (0, 5, 8, 17, 2050, 2060):
        gap = torch.randn(2061)
        mask = torch.ones(2061, dtype=torch.bool)
        gap[pos] = float("nan") if pos % 2 else float("-inf")
        if pos > 3:
            gap[pos - 3] = float("inf")
            mask[pos - 3] = False
        cu = torch.tensor([0, 9, 2049, 2061])
        with cpu_impl(impl), pytest.raises(ValueError, match=rf"gap must be finite .*gap\[{pos}\]"):
            pcsd_weights(gap, cu, mask)
    # a segment longer than the AVX2 kernel's chunk (2048 tokens) has a scale pass of its own:
    # in its vector body, in its last chunk, in its scalar tail
    for pos in (20, 2100, 4100, 5003):
        gap = torch.randn(5010)
        mask = torch.ones(5010, dtype=torch.bool)
        gap[pos] = float("inf")
        gap[pos - 5] = float("nan")
        mask[pos - 5] = False
        cu = torch.tensor([0, 5, 5005, 5010])
        with cpu_impl(impl), pytest.raises(ValueError, match=rf"gap must be finite .*gap\[{pos}\]"):
            pcsd_weights(gap, cu, mask)


@pytest.mark.skipif(not HAVE_AVX2, reason="CPU without AVX2/FMA")
def test_vectorised_exp_error_is_a_few_ulp():
    c = _native.kernels()
    x = torch.cat(
        [
            torch.linspace(-87.3, 0.0, 2_000_001),
            -torch.rand(100_000) * 88,
            -torch.rand(100_000) * 1e-3,
            torch.tensor([0.0, -0.0, -1e-30, -87.33, -1e4, -1e30]),
        ]
    )
    y = torch.empty_like(x)
    assert c.vexp_nonpositive(x.data_ptr(), y.data_ptr(), x.numel())
    exact = torch.exp(x.double())
    normal = exact >= torch.finfo(torch.float32).tiny
    ulp = (exact.float().nextafter(torch.tensor(math.inf)) - exact.float()).double()
    err_ulp = ((y.double() - exact).abs() / ulp)[normal]
    assert float(err_ulp.max()) <= 2.0, float(err_ulp.max())
    # below ln(FLT_MIN) the result is FLT_MIN-sized, never negative, NaN or a denormal
    assert bool(((y[~normal] >= 0) & (y[~normal] <= 1.2e-38)).all())
    assert float(y[x == 0][0]) == 1.0


# ----------------------------------------------------------------------------- the paper's facts
def decay_stats(n: int, alpha: float) -> tuple[float, float]:
    a = [alpha**i for i in range(n)]
    s = sum(a)
    n_eff = s * s / sum(x * x for x in a)
    d = sum(i * x for i, x in enumerate(a)) / s
    return n_eff, d


def test_effective_window_and_displacement_from_decay_weights():
    n_eff, d8 = decay_stats(8, 0.8)
    assert n_eff == pytest.approx(6.41, abs=0.005)
    assert d8 == pytest.approx(2.39, abs=0.005)
    # closed form of the appendix
    assert n_eff == pytest.approx((1.8 * (1 - 0.8**8)) / (0.2 * (1 + 0.8**8)), rel=1e-12)
    # the op's long-window estimate uses exactly these weights on a full window
    gap = torch.tensor([1.0, 0, 0, 0, 0, 0, 0, 0], dtype=torch.float64)
    ref = pcsd_weights_reference(gap, torch.tensor([0, 8]), n_min=8, n_max=8, adaptive=False)
    assert float(ref.adaptive[0]) == pytest.approx(1.0 / sum(0.8**i for i in range(8)), rel=1e-12)


def test_trend_factor_is_0_7_for_normalised_slope_minus_one():
    # Two tokens [1, 1/3]: slope = -2/3, scale = mean |delta| = 2/3, normalised slope = -1.
    gap = torch.tensor([1.0, 1.0 / 3.0])
    res = pcsd_weights(gap, torch.tensor([0, 2]), eps_slope=1e-12, eps_scale=1e-12, return_stats=True)
    assert float(res.slope[0]) == pytest.approx(-2.0 / 3.0, rel=1e-5)
    assert float(res.eta[0]) == pytest.approx(0.7, abs=1e-5)
    assert float(res.eta[1]) == 1.0  # one valid token in its window: slope 0
    var = (1.0 / 3.0) ** 2  # population variance of the two gaps
    r = (var - 0.05) / 0.45
    dbar8 = (1.0 + 0.8 / 3.0) / 1.8
    adaptive = (1 - r) * 1.0 + r * dbar8
    assert float(res.r[0]) == pytest.approx(r, rel=1e-5)
    assert float(res.adaptive[0]) == pytest.approx(adaptive, rel=1e-5)
    assert float(res.w[0]) == pytest.approx(0.7 / (1 + math.exp(-5.0 * adaptive)), abs=1e-5)


@needs_c
def test_slope_invariant_to_constant_shift_and_normalised_slope_to_scaling():
    gap, cu, mask = make_batch([50, 33, 64], 21, mask_p=0.2)
    base = pcsd_weights(gap, cu, mask, return_stats=True)
    shifted = pcsd_weights(gap + 3.5, cu, mask, return_stats=True)
    valid = mask
    torch.testing.assert_close(shifted.slope[valid], base.slope[valid], rtol=1e-4, atol=1e-4)
    scaled = pcsd_weights(gap * 7.0, cu, mask, return_stats=True)
    torch.testing.assert_close(scaled.slope[valid], 7.0 * base.slope[valid], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(scaled.eta[valid], base.eta[valid], rtol=1e-4, atol=1e-4)


@needs_c
@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10**6), log_mag=st.sampled_from([-2.0, 0.0, 2.0, 4.0]))
def test_bounds_of_eta_and_w(seed, log_mag):
    gap, cu, mask = make_batch([100, 3, 250], seed, mask_p=0.3, log_mag=log_mag)
    res = pcsd_weights(gap, cu, mask, return_stats=True)
    assert bool(((res.eta >= 0) & (res.eta <= 1)).all())
    assert bool(((res.w >= 0) & (res.w <= 1)).all())
    assert bool((res.w[~mask] == 0).all())
    assert bool(((res.r >= 0) & (res.r <= 1)).all())


@needs_c
def test_other_segments_never_change_this_segments_weights():
    gap, cu, mask = make_batch([40, 25, 60], 9, mask_p=0.1)
    base = pcsd_weights(gap, cu, mask)
    gap2 = gap.clone()
    gap2[:40] = torch.randn(40) * 100
    gap2[65:] = -gap2[65:]
    other = pcsd_weights(gap2, cu, mask)
    torch.testing.assert_close(other[40:65], base[40:65], rtol=0, atol=0)


def test_windows_never_cross_a_turn():
    # The same turn alone and followed by another turn gives the same weights.
    gap = torch.tensor([0.5, -1.0, 2.0, 0.1])
    alone = pcsd_weights(gap, torch.tensor([0, 4]))
    joined = pcsd_weights(torch.cat([gap, torch.full((8,), -9.0)]), torch.tensor([0, 4, 12]))
    torch.testing.assert_close(joined[:4], alone, rtol=0, atol=0)


# ----------------------------------------------------------------------------- plumbing
@needs_c
def test_opcheck_of_the_custom_ops():
    gap, cu, mask = make_batch([12, 0, 7], 1, mask_p=0.2)
    args = (1, 8, 0.8, 0.05, 0.5, 0.3, 5.0, 1e-6, 1e-6, True, True)
    torch.library.opcheck(torch.ops.pcsd.pcsd_weights.default, (gap, cu, mask, *args))
    torch.library.opcheck(torch.ops.pcsd.pcsd_weights.default, (gap, cu, None, *args))
    torch.library.opcheck(torch.ops.pcsd.pcsd_weights_stats.default, (gap, cu, mask, *args))
    torch.library.opcheck(torch.ops.pcsd.pcsd_weights_out.default, (gap, cu, mask, torch.empty_like(gap), *args))


@needs_c
def test_torch_compile_fullgraph():
    gap, cu, mask = make_batch([30, 5, 64], 2, mask_p=0.2)
    student = torch.randn(gap.numel())
    teacher = student + gap

    def step(student, teacher, cu, mask):
        w = pcsd_weights(teacher - student, cu, mask)
        return pcsd_loss(student, teacher, w, mask)

    compiled = torch.compile(step, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(student, teacher, cu, mask), step(student, teacher, cu, mask))


def test_loss_value_and_gradient():
    torch.manual_seed(0)
    s = torch.randn(20, dtype=torch.float64, requires_grad=True)
    t = torch.randn(20, dtype=torch.float64, requires_grad=True)
    w = torch.rand(20, dtype=torch.float64, requires_grad=True)
    m = torch.rand(20) > 0.3
    loss = pcsd_loss(s, t, w, m)
    md = m.double()
    expected = (md * w * (t - s)).sum() / md.sum()
    torch.testing.assert_close(loss, expected)
    loss.backward()
    torch.testing.assert_close(s.grad, -md * w.detach() / md.sum())
    assert t.grad is None and w.grad is None  # detached: no gradient reaches them
    torch.autograd.gradcheck(lambda x: pcsd_loss(x, t.detach(), w.detach(), m), (s.detach().requires_grad_(),))
    # normalised by M, not by sum(w)
    z = pcsd_loss(s, t, torch.zeros_like(w), m)
    assert float(z) == 0.0
    empty = pcsd_loss(s, t, w, torch.zeros(20, dtype=torch.bool))
    assert float(empty) == 0.0


# ----------------------------------------------------------------------------- bad input
GOOD = dict(gap=torch.zeros(5), cu_seqlens=torch.tensor([0, 2, 5]))


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(gap=torch.zeros(5, dtype=torch.float64)), "gap must be float32"),
        (dict(gap=torch.zeros(1, 5)), "gap must be 1-D"),
        (dict(gap=[0.0] * 5), "gap must be a torch.Tensor"),
        (dict(cu_seqlens=torch.tensor([0.0, 5.0])), "cu_seqlens must be int32 or int64"),
        (dict(cu_seqlens=torch.tensor([[0, 5]])), "cu_seqlens must be 1-D"),
        (dict(cu_seqlens=torch.tensor([1, 5])), r"cu_seqlens\[0\] must be 0"),
        (dict(cu_seqlens=torch.tensor([0, 4, 3, 5])), "non-decreasing"),
        (dict(cu_seqlens=torch.tensor([0, 2, 4])), "must equal the number of tokens"),
        (dict(mask=torch.ones(4, dtype=torch.bool)), "mask must have gap's shape"),
        (dict(mask=torch.ones(5, dtype=torch.int64)), "mask must be bool or a float"),
        (dict(mask=torch.full((5,), 0.5)), "only 0 and 1"),
        (dict(gap=torch.tensor([0.0, float("nan"), 0, 0, 0])), "finite"),
        (dict(gap=torch.tensor([0.0, 0, 0, float("inf"), 0])), "finite"),
        (dict(out=torch.zeros(4)), "out must be a float32 tensor"),
        (dict(n_min=0), "n_min must be an integer >= 1"),
        (dict(n_min=3, n_max=2), "n_max must be an integer >= n_min"),
        (dict(alpha=0.0), r"alpha must be in \(0, 1\]"),
        (dict(alpha=1.5), r"alpha must be in \(0, 1\]"),
        (dict(tau_low=0.5, tau_high=0.5), "tau_low must be < tau_high"),
        (dict(beta_gate=-1.0), "beta_gate must be >= 0"),
        (dict(gamma=-0.1), "gamma must be >= 0"),
        (dict(eps_slope=0.0), "eps_slope must be > 0"),
        (dict(alpha=float("nan")), "alpha must be a finite number"),
    ],
)
def test_bad_input_raises_value_error_naming_the_argument(change, match):
    kw = {**GOOD, **change}
    with pytest.raises(ValueError, match=match):
        pcsd_weights(**kw)


def test_nonfinite_gap_at_masked_position_is_allowed():
    gap = torch.tensor([0.1, float("nan"), -0.2, float("inf")])
    mask = torch.tensor([True, False, True, False])
    w = pcsd_weights(gap, torch.tensor([0, 4]), mask)
    assert bool(torch.isfinite(w).all()) and float(w[1]) == 0.0 and float(w[3]) == 0.0


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_device_mismatch_is_reported():
    with pytest.raises(ValueError, match="cu_seqlens must be on gap's device"):
        pcsd_weights(torch.zeros(3, device="cuda"), torch.tensor([0, 3]))


def test_device_mismatch_is_reported_on_meta():
    with pytest.raises(ValueError, match="mask must be on gap's device"):
        pcsd_weights(torch.zeros(3), torch.tensor([0, 3]), torch.ones(3, dtype=torch.bool, device="meta"))


def test_empty_input():
    w = pcsd_weights(torch.zeros(0), torch.tensor([0]))
    assert w.shape == (0,)
    w = pcsd_weights(torch.zeros(0), torch.tensor([0, 0, 0], dtype=torch.int32))
    assert w.shape == (0,)


@needs_c
@pytest.mark.parametrize("impl", IMPLS)
def test_long_segment_has_no_drift(impl):
    # One 200k-token turn: large gaps first, then a constant tail. The kernel slides its window
    # sums; rounding must not accumulate across the turn.
    g = torch.Generator().manual_seed(0)
    gap = torch.randn(200_000, generator=g) * 1e3
    gap[150_000:] = 0.25
    mask = torch.rand(200_000, generator=g) > 0.1
    cu = torch.tensor([0, 200_000])
    with cpu_impl(impl):
        got = pcsd_weights(gap, cu, mask, return_stats=True)
    assert_close_to_ref(got, gap, cu, mask)
    tail = slice(150_000, 199_990)
    assert bool((got.slope[tail][mask[tail]].abs() < 1e-6).all())
    assert bool((got.r[tail] == 0).all())


# ----------------------------------------------------------------------------- the defaults, in one place
def _header_defaults() -> dict[str, float]:
    """``{name: value}`` of ``struct PcsdParams``'s numeric defaults in ``csrc/pcsd_kernels.h``."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "csrc" / "pcsd_kernels.h").read_text()
    body = re.search(r"struct PcsdParams \{(.*?)\};", text, re.S)
    assert body, "struct PcsdParams not found in csrc/pcsd_kernels.h"
    fields = re.findall(r"^\s*(?:int64_t|double)\s+(\w+)\s*=\s*([^;]+);", body.group(1), re.M)
    return {name: float(value) for name, value in fields}


def test_the_native_header_has_the_python_defaults():
    """csrc/pcsd_kernels.h repeats PCSD's defaults for C++ callers: they must be pcsd.ops.defaults'."""
    from pcsd.ops.defaults import PCSD_DEFAULTS

    want = {k: float(v) for k, v in PCSD_DEFAULTS.as_dict().items()}
    assert _header_defaults() == want


def test_every_reader_takes_the_defaults_from_one_place():
    """The op's wrapper, both references, the rules, the config schema and the benchmark cases read
    pcsd.ops.defaults: each default equals it (and the signatures name all nine parameters)."""
    import dataclasses
    import inspect

    from pcsd.bench.op_cases import Params
    from pcsd.ops.defaults import PCSD_DEFAULTS
    from pcsd.ops.reference import pcsd_weights_loop
    from pcsd.ops.weighting import get_rule
    from pcsd.train.config import PcsdParams

    want = PCSD_DEFAULTS.as_dict()
    for fn in (pcsd_weights, pcsd_weights_reference, pcsd_weights_loop):
        sig = inspect.signature(fn).parameters
        assert {k: sig[k].default for k in want} == want, fn.__name__
    assert {k: getattr(Params(), k) for k in want} == want
    schema = dataclasses.asdict(PcsdParams())
    assert schema == {k: v for k, v in want.items() if k in schema} and len(schema) == 7
    assert get_rule("pcsd").defaults == want
    for name in ("sdar", "sdar-norm"):
        assert get_rule(name).defaults == {"beta_gate": want["beta_gate"]}
    with pytest.raises(dataclasses.FrozenInstanceError):
        PCSD_DEFAULTS.alpha = 0.5  # type: ignore[misc]


def test_reading_the_defaults_does_not_import_torch():
    """The config schema reads pcsd.ops.defaults at import: that must not load torch (pcsd.ops loads
    its op lazily)."""
    import subprocess
    import sys

    code = "import sys, pcsd.ops.defaults, pcsd.train.config; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
