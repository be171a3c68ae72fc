#!/usr/bin/env python3
"""GPU self-test and benchmark for the CUDA PCSD-weights kernel (csrc/pcsd_cuda.cu).

Run on a machine with a CUDA GPU, from the repository root, after building pcsd._C with CUDA
(``PCSD_CUDA=on tools/build_inplace.sh`` or ``pip install .``)::

    python tools/cuda_selftest.py            # correctness + timing at 1M and 10M tokens
    python tools/cuda_selftest.py --quick    # correctness only, fewer cases

Correctness: the cases of :mod:`pcsd.bench.op_cases` (random varlen batches with masks, NaN/Inf
garbage at masked positions, magnitudes 1e-3..1e3, constant runs, trends, a long segment spanning
many tiles, unaligned views, guard sentinels, bitwise determinism, the w-only launch) through
``pcsd._C.pcsd_weights_cuda`` against the CPU kernel ``pcsd._C.pcsd_weights_cpu`` (fp64), with
the tolerances documented there. ``python -m pcsd.bench gpu`` runs the same cases as its first part.

Timing: CUDA events around the whole call (three kernels + stream-ordered scratch) at 1M and 10M
tokens, against a device-to-device copy that moves the same number of bytes (the kernel reads
gap + mask = 5 B/token and writes w = 4 B/token). The printed ratio is (kernel bytes / kernel
time) / (copy bytes / copy time); the target is >= 0.6. Exit status 0 only when every check passes.
"""

from __future__ import annotations

import argparse
import sys

import torch

try:
    from pcsd import _C
except ImportError as exc:  # pragma: no cover - depends on the build
    sys.exit(f"pcsd._C is not importable ({exc}); build it first (tools/build_inplace.sh)")

from pcsd.bench.op_cases import bandwidth, correctness


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer correctness cases, no timing")
    ap.add_argument("--no-bench", action="store_true", help="skip the timing")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to test", file=sys.stderr)
        return 2
    if not hasattr(_C, "pcsd_weights_cuda"):
        print(f"pcsd._C was built without CUDA kernels: {_C.build_info()}", file=sys.stderr)
        return 2
    print(f"device: {torch.cuda.get_device_name()}  build: {_C.build_info()}")
    print("correctness (CUDA vs CPU):")
    _, errs = correctness("quick" if args.quick else "full")
    if not (args.quick or args.no_bench):
        print("timing (whole call incl. scratch; ratio = effective bandwidth / D2D copy bandwidth):")
        for total in (1_000_000, 10_000_000):
            for use_mask in (True, False):
                r = bandwidth(total, use_mask)
                print(
                    f"  T={total:>9}  {'mask' if use_mask else 'no mask':<8} {r['kernel_s'] * 1e6:8.1f} us"
                    f"  {r['kernel_GBps']:7.1f} GB/s  ratio={r['kernel_vs_copy']:.2f}"
                    f"{'' if r['kernel_vs_copy'] >= 0.6 or total < 10_000_000 else '  (below the 0.6 target)'}"
                    f"  public call {r['api_s'] * 1e6:.1f} us = {r['api_vs_kernel']:.2f}x the kernel"
                    f"{'' if r['api_vs_kernel'] <= 1.3 or total < 10_000_000 else '  (above the 1.3 target)'}"
                )
                for name, us in r.get("kernel_breakdown_us", {}).items():
                    print(f"      {us:8.1f} us  {name}")
    if errs:
        print(f"\n{len(errs)} FAILURES:")
        for e in errs[:50]:
            print("  " + e)
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
