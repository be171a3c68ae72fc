"""Benchmark of the PCSD weights op (not a test): the native CPU kernel (the AVX2 kernel where the
CPU has it, and the portable scalar kernel) vs the eager PyTorch reference vs the torch.compile'd
reference, achieved bytes/s vs a plain copy of the same bytes, and peak extra memory per token.
Every figure is a ratio measured in the same run; the candidates are timed round-robin (one call
of each per round) so that a changing machine load hits all of them alike. The load average is
printed before and after.

    python benchmarks/bench_pcsd_op.py [--tokens 1000000 10000000] [--repeats 5] [--threads 1 2]
                                       [--no-compile] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from pcsd import _native  # noqa: E402
from pcsd.bench.common import machine_line, measure  # noqa: E402
from pcsd.bench.op import make_segments as make  # noqa: E402
from pcsd.ops.kernels import kernel_for, pcsd_weights  # noqa: E402
from pcsd.ops.reference import pcsd_weights_reference  # noqa: E402


def round_robin(fns: dict, repeats: int, sync) -> dict[str, dict]:
    """One warm-up call of each, then ``repeats`` rounds of one timed call of each
    (:func:`pcsd.bench.common.measure` per call). Returns name -> {median_s, spread_s, cpu_s}: wall-clock
    median and spread, and the median CPU time of the process per call (``time.process_time``:
    all threads together; on a machine shared with other jobs it is not inflated by waiting for a
    core, so with one thread it is the fairer speed figure)."""
    for fn in fns.values():
        measure(fn, 1, warmup=0, sync=sync)
    times: dict[str, list[float]] = {k: [] for k in fns}
    cpu: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            c0 = time.process_time()
            times[name].append(measure(fn, 1, warmup=0, sync=sync)["median_s"])
            cpu[name].append(time.process_time() - c0)
    return {
        k: dict(median_s=statistics.median(v), spread_s=max(v) - min(v), cpu_s=statistics.median(cpu[k]))
        for k, v in times.items()
    }


def forced(impl: str, fn):
    """``fn`` run with the CPU kernel forced to ``impl`` (the binding reads PCSD_CPU_KERNEL)."""

    def call():
        old = os.environ.get("PCSD_CPU_KERNEL")
        os.environ["PCSD_CPU_KERNEL"] = impl
        try:
            return fn()
        finally:
            if old is None:
                os.environ.pop("PCSD_CPU_KERNEL", None)
            else:
                os.environ["PCSD_CPU_KERNEL"] = old

    return call


def peak_worker(which: str, total: int) -> dict:
    """Run in a fresh process: peak RSS growth of one call over its inputs and output, after a
    small warm-up call (so one-time allocations such as thread pools are not counted)."""
    page = os.sysconf("SC_PAGE_SIZE")

    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * page

    torch.set_num_threads(1)
    small = make(20_000)
    gap, cu, mask = make(total)
    out = torch.zeros_like(gap)  # written now, so its pages are resident before the baseline

    def fn(g, c, m, o):
        if which == "eager":
            return pcsd_weights_reference(g, c, m)
        return forced(which, lambda: pcsd_weights(g, c, m, out=o))()

    fn(*small, torch.empty_like(small[0]))
    base = rss()
    peak = [base]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], rss())
            stop.wait(0.0002)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    fn(gap, cu, mask, out)
    fn(gap, cu, mask, out)
    stop.set()
    th.join()
    peak[0] = max(peak[0], rss())
    return dict(which=which, tokens=total, extra_bytes=peak[0] - base)


def peak_extra_bytes_per_token(which: str, total: int) -> float:
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--peak-worker", which, str(total)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])["extra_bytes"] / total


def run(tokens: list[int], repeats: int, device: str, threads: list[int], compile_ref: bool) -> list[dict]:
    rows = []
    sync = torch.cuda.synchronize if device == "cuda" else None
    ref_compiled = torch.compile(pcsd_weights_reference) if compile_ref else None
    c = _native.kernels()
    for total in tokens:
        gap, cu, mask = make(total, device)
        out = torch.empty_like(gap)
        nbytes = gap.numel() * (4 + 1 + 4)  # read gap + mask, write w
        src = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
        dst = torch.empty_like(src)
        expect = pcsd_weights_reference(gap, cu, mask).w
        max_err = float((pcsd_weights(gap, cu, mask) - expect).abs().max()) if total else 0.0
        mem = {}
        if device == "cpu":
            for which in ("auto", "scalar", "eager"):
                mem[which] = peak_extra_bytes_per_token(which, total)
        for nt in threads:
            torch.set_num_threads(nt)
            fns = {
                "native": lambda: pcsd_weights(gap, cu, mask, out=out),
                "eager": lambda: pcsd_weights_reference(gap, cu, mask),
                "copy": lambda: dst.copy_(src),
            }
            if device == "cpu":
                fns["scalar"] = forced("scalar", lambda: pcsd_weights(gap, cu, mask, out=out))
            if ref_compiled is not None:
                fns["compiled"] = lambda: ref_compiled(gap, cu, mask)
            m = round_robin(fns, repeats, sync)
            t_nat = m["native"]["median_s"]
            kernel = kernel_for(gap.device)
            if kernel == "cpu" and c is not None:
                kernel = f"cpu-{c.cpu_kernel(1, 8, 0.8)}"
            row = dict(
                device=device,
                kernel=kernel,
                tokens=total,
                threads=nt,
                native_ms=t_nat * 1e3,
                native_spread_ms=m["native"]["spread_s"] * 1e3,
                ns_per_token=t_nat * 1e9 / total,
                eager_ref_ms=m["eager"]["median_s"] * 1e3,
                eager_ref_spread_ms=m["eager"]["spread_s"] * 1e3,
                speedup_vs_eager=m["eager"]["median_s"] / t_nat,
                native_GBps=nbytes / t_nat / 1e9,
                copy_GBps=nbytes / m["copy"]["median_s"] / 1e9,
                bandwidth_vs_copy=m["copy"]["median_s"] / t_nat,
                max_abs_err_vs_ref=max_err,
            )
            if device == "cpu" and nt == 1:  # CPU-time ratios (see round_robin)
                row["native_cpu_ms"] = m["native"]["cpu_s"] * 1e3
                row["eager_ref_cpu_ms"] = m["eager"]["cpu_s"] * 1e3
                row["cpu_time_speedup_vs_eager"] = m["eager"]["cpu_s"] / max(m["native"]["cpu_s"], 1e-9)
                if "compiled" in m:
                    row["cpu_time_speedup_vs_compiled"] = m["compiled"]["cpu_s"] / max(m["native"]["cpu_s"], 1e-9)
            if "scalar" in m:
                row["scalar_ms"] = m["scalar"]["median_s"] * 1e3
                row["speedup_vs_scalar"] = m["scalar"]["median_s"] / t_nat
            if "compiled" in m:
                row["compiled_ref_ms"] = m["compiled"]["median_s"] * 1e3
                row["speedup_vs_compiled"] = m["compiled"]["median_s"] / t_nat
            if mem:
                row["extra_B_per_token_native"] = mem["auto"]
                row["extra_B_per_token_scalar"] = mem["scalar"]
                row["extra_B_per_token_eager"] = mem["eager"]
            rows.append(row)
    return rows


COLS = [
    "device",
    "kernel",
    "tokens",
    "threads",
    "native_ms",
    "native_spread_ms",
    "ns_per_token",
    "scalar_ms",
    "eager_ref_ms",
    "compiled_ref_ms",
    "speedup_vs_scalar",
    "speedup_vs_eager",
    "speedup_vs_compiled",
    "native_cpu_ms",
    "eager_ref_cpu_ms",
    "cpu_time_speedup_vs_eager",
    "cpu_time_speedup_vs_compiled",
    "native_GBps",
    "copy_GBps",
    "bandwidth_vs_copy",
    "extra_B_per_token_native",
    "extra_B_per_token_scalar",
    "extra_B_per_token_eager",
    "max_abs_err_vs_ref",
]


def print_table(rows: list[dict], loads: tuple) -> None:
    print(f"machine: {machine_line()}")
    print(f"load average (1, 5, 15 min) before: {loads[0]}, after: {loads[1]}")
    cols = [c for c in COLS if any(c in r for r in rows)]
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(f"{r[c]:.3g}" if isinstance(r.get(c), float) else str(r.get(c, "")) for c in cols))


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, nargs="+", default=None, help="thread counts (default: 1 and all cores)")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile column")
    ap.add_argument("--json", default=None)
    ap.add_argument("--peak-worker", nargs=2, metavar=("WHICH", "TOKENS"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.peak_worker:
        print(json.dumps(peak_worker(args.peak_worker[0], int(args.peak_worker[1]))))
        return []
    threads = args.threads or sorted({1, os.cpu_count() or 1})
    load_before = tuple(round(x, 2) for x in os.getloadavg())
    rows = run(args.tokens, args.repeats, "cpu", threads, not args.no_compile)
    if torch.cuda.is_available():
        rows += run(args.tokens, args.repeats, "cuda", [torch.get_num_threads()], not args.no_compile)
    load_after = tuple(round(x, 2) for x in os.getloadavg())
    print_table(rows, (load_before, load_after))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"machine": machine_line(), "load_before": load_before, "load_after": load_after, "rows": rows},
                f,
                indent=2,
            )
    return rows


if __name__ == "__main__":
    main()
