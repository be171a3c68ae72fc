"""The CUDA kernels of csrc/pcsd_cuda.cu, executed on the CPU through tools/cuda_emu, against the
CPU kernel. Needs only g++ with C++20 (<barrier>); no GPU and no nvcc. On a GPU machine the real
check is tools/cuda_selftest.py."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None, reason="no C++ compiler")
def test_cuda_kernels_match_cpu_kernel_under_emulation(tmp_path: Path) -> None:
    env = dict(os.environ, PCSD_EMU_BUILD=str(tmp_path))
    proc = subprocess.run(
        ["bash", str(ROOT / "tools" / "cuda_emu" / "run.sh"), "--quick"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = proc.stdout + proc.stderr
    if proc.returncode != 0 and "error:" in out and "barrier" in out:
        pytest.skip("the C++ compiler lacks C++20 <barrier>")
    failed = [line for line in out.splitlines() if "FAIL" in line]
    assert proc.returncode == 0, "\n".join(failed[:20]) or out[-4000:]
    assert out.rstrip().endswith("0 failed"), out[-2000:]
    # The harness must have compared a substantial number of cases.
    passed = int(out.rstrip().splitlines()[-1].split()[0])
    assert passed >= 150, out[-2000:]


@pytest.fixture(scope="module")
def emulated_c(tmp_path_factory):
    """pcsd._C built with the emulated CUDA kernels behind ``pcsd_weights_cuda`` (host pointers)."""
    import importlib.machinery
    import importlib.util
    import sys

    if shutil.which(os.environ.get("CXX", "g++")) is None:
        pytest.skip("no C++ compiler")
    out = tmp_path_factory.mktemp("emu_module")
    env = dict(os.environ, PCSD_EMU_BUILD=str(out), PYTHON=sys.executable)
    proc = subprocess.run(
        ["bash", str(ROOT / "tools" / "cuda_emu" / "run.sh"), "--module", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    path = next(out.glob("_C*.so"))
    loader = importlib.machinery.ExtensionFileLoader("pcsd_emulated._C", str(path))
    spec = importlib.util.spec_from_loader("pcsd_emulated._C", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_public_call_on_the_cuda_path_validates_in_the_kernels(emulated_c, monkeypatch):
    """The public call through the (emulated) CUDA kernels and the extension's entry point: the
    CPU kernel's weights (the self-test's tolerances), no torch-op value checks on that path (the
    kernels validate while they read; one verdict comes back), and each fault named in the CPU
    path's words."""
    from dataclasses import asdict

    import numpy as np
    import torch

    from pcsd import _native
    from pcsd.bench.op_cases import PARAM_SETS, api_accepts, compare, make_batch, run_cpu
    from pcsd.ops import kernels

    rng = np.random.default_rng(5)
    b = make_batch(rng, [300, 0, 2500, 7, 1900, 1])
    gap, cu, mask = torch.from_numpy(b.gap), torch.from_numpy(b.cu), torch.from_numpy(b.mask != 0)
    valid = torch.nonzero(mask).squeeze(1)
    faults = {
        "start": (gap, torch.cat([cu[:1] + 1, cu[1:]]), mask),
        "decrease": (gap, cu.clone().index_fill_(0, torch.tensor([3]), 1), mask),
        "end": (gap, torch.cat([cu[:-1], cu[-1:] - 2]), mask),
        "past the end": (gap, torch.cat([cu[:-1], cu[-1:] + 5000]), mask),
        "nan": (gap.clone().index_fill_(0, valid[[2000, 40]], float("nan")), cu, mask),
        "float mask": (gap, cu, mask.float().index_fill_(0, valid[7:8], 0.5)),
        "no segments": (gap, cu[:1], mask),
    }

    def call_all():
        got = {}
        for name, args in faults.items():
            try:
                kernels.pcsd_weights(*args)
                got[name] = "accepted"
            except ValueError as e:
                got[name] = str(e)
        return got

    cpu = call_all()
    with monkeypatch.context() as mp:
        mp.setattr(_native, "kernels", lambda: emulated_c)
        mp.setattr(_native, "require", lambda name: emulated_c)
        mp.setattr(kernels, "kernel_for", lambda device: "cuda")
        mp.setattr(kernels, "_cuda_call", lambda device, fn: fn(0))
        reads: list = []
        mp.setattr(kernels, "_check_data", lambda *a: reads.append(a))
        emu = call_all()
        for pname, p in [ps for ps in PARAM_SETS if api_accepts(ps[1])][:3]:
            res = kernels.pcsd_weights(gap, cu, mask, return_stats=True, **asdict(p))
            got = {k: v.numpy() for k, v in zip(("w", "ad", "r", "slope", "eta"), res)}
            assert compare(pname, b, p, run_cpu(b, p), got, True, log=None) == []
    assert reads == []
    assert emu == cpu and all(m != "accepted" for m in cpu.values()), (emu, cpu)
