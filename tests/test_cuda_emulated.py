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
