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
