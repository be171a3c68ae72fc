"""CUDA-only tests (marker ``cuda``; ``pytest -m cuda`` runs them, as ``python -m pcsd.bench gpu``
does): they skip without a CUDA device. The public op on CUDA tensors against the CPU kernel, and
the small forms of the GPU bench's parts, each of which compares the GPU against a plain reference
(the fused loss against float64, update_step against the CPU, generation against rescoring)."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_the_build_has_cuda_kernels_and_the_op_dispatches_to_them():
    import pcsd
    from pcsd.ops.kernels import kernel_for

    info = pcsd.native_info()["_C"]
    assert info["cuda_kernels"], f"pcsd._C was built without CUDA kernels (PCSD_CUDA=on pip install .): {info}"
    assert kernel_for(torch.device("cuda")) == "cuda"


@pytest.mark.parametrize("seed", range(5))
def test_public_op_on_cuda_equals_the_cpu_kernel(seed):
    # the public op (its checks, the mask conversion, the dispatch) on the self-test's batches and
    # tolerances (pcsd.bench.op_cases), against the CPU kernel's fp64 results
    from dataclasses import asdict

    import numpy as np

    from pcsd.bench.op_cases import PARAM_SETS, api_accepts, compare, make_batch, run_cpu
    from pcsd.ops.kernels import pcsd_weights

    rng = np.random.default_rng(seed)
    b = make_batch(rng, list(rng.integers(0, 700, int(rng.integers(1, 300)))))
    for pname, p in [ps for ps in PARAM_SETS if api_accepts(ps[1])]:
        got = pcsd_weights(
            torch.from_numpy(b.gap).cuda(),
            torch.from_numpy(b.cu).cuda(),
            torch.from_numpy(b.mask != 0).cuda(),
            return_stats=True,
            **asdict(p),
        )
        assert got.w.is_cuda
        got = {k: v.cpu().numpy() for k, v in zip(("w", "ad", "r", "slope", "eta"), got)}
        assert compare(pname, b, p, run_cpu(b, p), got, True, log=None) == []


@pytest.mark.parametrize("name", ["op", "fused", "update", "paper_update", "hf_generation"])
def test_gpu_bench_part_passes_on_small_shapes(name, tmp_path):
    from pcsd.bench.gpu import Ctx, run_part

    part = run_part(name, Ctx(torch.device("cuda"), True, tmp_path, None))
    assert part.status == "pass", (part.reason, part.figures.get("traceback"))


def test_fused_lm_head_float32_output_gemms_equal_the_sliced_fallback(monkeypatch):
    # the fused lm-head's fast path on CUDA (bf16 operands, GEMMs writing and accumulating float32)
    # against its sliced fallback: the same loss, log-probs and gradients within bf16's rounding
    import pcsd.ops.fused as fused

    dev = torch.device("cuda")
    assert fused.out_dtype_gemms(dev, torch.bfloat16, torch.float32), f"torch {torch.__version__}: no out_dtype GEMMs"
    g = torch.Generator(device=dev).manual_seed(0)
    n, vocab, hid = 300, 5000, 64
    h = torch.randn(n, hid, device=dev, generator=g, requires_grad=True)
    w = (torch.randn(vocab, hid, device=dev, generator=g) / hid**0.5).requires_grad_(True)
    t = torch.randint(0, vocab, (n,), device=dev, generator=g)
    coef = torch.randn(n, device=dev, generator=g)

    def run():
        h.grad = w.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss, lp = fused.fused_logprob_loss(
                h, w, t, lambda x, lo, hi: coef[lo:hi] * x, token_chunk=64, group_elems=128 * vocab
            )
        loss.backward()
        return loss.detach(), lp, h.grad.clone(), w.grad.clone()

    fast = run()
    monkeypatch.setattr(fused, "out_dtype_gemms", lambda *a: False)
    slow = run()
    for a, b in zip(fast, slow):
        assert float((a - b).norm() / b.norm()) < 1e-2
