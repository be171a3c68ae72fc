"""``python -m pcsd.bench op``: the native PCSD weights kernel vs the eager and torch.compile
reference and a plain copy (bandwidth), on CPU and, with a GPU, CUDA."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Sequence

import torch

from pcsd.bench.common import emit, measure, pos_int


def make_segments(total: int, device: str = "cpu", seed: int = 0):
    """Packed PCSD-op inputs: ``gap [T]``, ``cu_seqlens [S+1]``, ``mask [T]`` with realistic
    turn lengths (20..512 tokens)."""
    g = torch.Generator().manual_seed(seed)
    lengths = []
    n = 0
    while n < total:
        length = min(int(torch.randint(20, 513, (1,), generator=g)), total - n)
        lengths.append(length)
        n += length
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    cu[1:] = torch.tensor(lengths).cumsum(0)
    gap = torch.randn(total, generator=g) * 0.5 - 0.2
    mask = torch.rand(total, generator=g) > 0.05
    return gap.to(device), cu.to(device), mask.to(device)


def bench_op(
    tokens: Sequence[int], threads: Sequence[int], repeats: int, compile_ref: bool, device: str = "cpu"
) -> tuple[list[dict], list[str]]:
    from pcsd.ops.kernels import kernel_for, pcsd_weights
    from pcsd.ops.reference import pcsd_weights_reference

    notes: list[str] = []
    sync = torch.cuda.synchronize if device == "cuda" else None
    compiled = None
    if compile_ref:
        try:
            compiled = torch.compile(pcsd_weights_reference)
            g, c, m = make_segments(1000, device)
            compiled(g, c, m)
        except Exception as exc:  # no C compiler, unsupported backend ...
            compiled = None
            notes.append(f"torch.compile column skipped: {type(exc).__name__}: {str(exc)[:200]}")
    rows = []
    for total in tokens:
        gap, cu, mask = make_segments(total, device)
        out = torch.empty_like(gap)
        nbytes = gap.numel() * (4 + 1 + 4)  # read gap + mask, write w
        src = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
        dst = torch.empty_like(src)
        expect = pcsd_weights_reference(gap, cu, mask).w
        got = pcsd_weights(gap, cu, mask)
        max_err = float((got - expect).abs().max()) if total else 0.0
        for nt in threads:
            torch.set_num_threads(nt)
            m_nat = measure(lambda: pcsd_weights(gap, cu, mask, out=out), repeats, sync=sync)
            m_ref = measure(lambda: pcsd_weights_reference(gap, cu, mask), repeats, sync=sync)
            m_cp = measure(lambda: dst.copy_(src), repeats, sync=sync)
            row = dict(
                device=device,
                kernel=kernel_for(gap.device),
                tokens=total,
                threads=nt,
                native_ms=m_nat["median_s"] * 1e3,
                native_spread_ms=m_nat["spread_s"] * 1e3,
                eager_ms=m_ref["median_s"] * 1e3,
                eager_spread_ms=m_ref["spread_s"] * 1e3,
                copy_ms=m_cp["median_s"] * 1e3,
                speedup_vs_eager=m_ref["median_s"] / m_nat["median_s"],
                native_GBps=nbytes / m_nat["median_s"] / 1e9,
                copy_GBps=nbytes / m_cp["median_s"] / 1e9,
                bandwidth_vs_copy=m_cp["median_s"] / m_nat["median_s"],
                max_abs_err_vs_ref=max_err,
            )
            if compiled is not None:
                m_c = measure(lambda: compiled(gap, cu, mask), repeats, sync=sync)
                row.update(
                    compiled_ms=m_c["median_s"] * 1e3,
                    compiled_spread_ms=m_c["spread_s"] * 1e3,
                    speedup_vs_compiled=m_c["median_s"] / m_nat["median_s"],
                )
            rows.append(row)
    torch.set_num_threads(os.cpu_count() or 1)
    return rows, notes


def cmd_op(args) -> dict:
    threads = args.threads or sorted({1, os.cpu_count() or 1})
    rows, notes = bench_op(args.tokens, threads, args.repeats, not args.no_compile)
    if torch.cuda.is_available():
        r2, n2 = bench_op(args.tokens, [torch.get_num_threads()], args.repeats, not args.no_compile, "cuda")
        rows += r2
        notes += n2
    cols = [
        "device",
        "kernel",
        "tokens",
        "threads",
        "native_ms",
        "native_spread_ms",
        "eager_ms",
        "eager_spread_ms",
        "compiled_ms",
        "speedup_vs_eager",
        "speedup_vs_compiled",
        "native_GBps",
        "copy_GBps",
        "bandwidth_vs_copy",
        "max_abs_err_vs_ref",
    ]

    def plot(ax, rows):
        labels = [f"{r['device']} {r['tokens']:,}t {r['threads']}thr" for r in rows]
        ax.plot(labels, [r["native_GBps"] for r in rows], "o-", label="native kernel")
        ax.plot(labels, [r["copy_GBps"] for r in rows], "s--", label="plain copy")
        ax.set_ylabel("GB/s")
        ax.legend()
        ax.tick_params(axis="x", labelsize=7, rotation=30)

    return emit(
        "op",
        "PCSD weights op: native kernel vs eager / torch.compile reference",
        rows,
        cols,
        Path(args.out),
        args,
        notes,
        plot,
    )


NAME = "op"
HELP = "PCSD weights op: native vs eager vs torch.compile reference vs copy"
#: sizes: (full, --quick, --tiny); --tiny is for the tests (seconds)
DEFAULTS: dict[str, tuple] = dict(tokens=([1_000_000, 10_000_000], [1_000_000], [20_000]), repeats=(5, 5, 2))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokens", type=pos_int, nargs="+")
    p.add_argument("--threads", type=pos_int, nargs="+", help="torch threads (default 1 and all)")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile column")


run = cmd_op
