"""Helpers every benchmark shares: the machine line, timing (:func:`measure`, :func:`measure_pool`
with the pool workers' CPU time), the Amdahl bound, the rich table + JSON + PNG writer (:func:`emit`) and
the command-line pieces (sizes, ``--quick`` / ``--tiny``)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

FULL_VOCAB = 151_936  # Qwen2.5 / Qwen3 vocabulary


def machine_line() -> str:
    """CPU model, cores, GPU, torch version."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{cpu}, {os.cpu_count()} cores, {gpu}, torch {torch.__version__}"


def measure(fn: Callable[[], Any], repeats: int, warmup: int = 1, sync: Callable[[], None] | None = None) -> dict:
    """Run ``fn`` ``warmup`` times untimed, then ``repeats`` times timed.

    Returns ``median_s``, ``min_s``, ``max_s``, ``spread_s`` (max - min) and ``times_s``.
    """
    if repeats < 1:
        raise ValueError(f"repeats: expected >= 1, got {repeats}")
    sync = sync or (lambda: None)
    for _ in range(warmup):
        fn()
        sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return dict(
        median_s=statistics.median(times),
        min_s=min(times),
        max_s=max(times),
        spread_s=max(times) - min(times),
        times_s=times,
    )


POOL_THREAD_PREFIX = "pcsd-envpool-"  # the native pool names its worker threads pcsd-envpool-<i>


def pool_worker_cpu_by_thread() -> dict[int, int] | None:
    """CPU time (ns) used so far by each of this process's env-pool worker threads (by thread id),
    from Linux ``/proc/self/task/*/schedstat``; None where that is not available."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    out: dict[int, int] = {}
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if not f.read().startswith(POOL_THREAD_PREFIX):
                    continue
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                out[int(tid)] = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # the thread exited meanwhile
    return out


def pool_worker_cpu_ns() -> int | None:
    """CPU time (ns) used so far by this process's env-pool worker threads; None where
    ``/proc/self/task/*/schedstat`` is not available."""
    per = pool_worker_cpu_by_thread()
    return None if per is None else sum(per.values())


def _worker_cpu_delta(before: dict[int, int], after: dict[int, int]) -> int:
    """Worker CPU spent between two readings, thread by thread: a thread that exited meanwhile
    (an earlier pool dropped by the garbage collector) takes nothing away, a new one counts whole."""
    return sum(max(0, ns - before.get(tid, 0)) for tid, ns in after.items())


def measure_pool(fn: Callable[[], Any], repeats: int, env_steps: int) -> dict:
    """:func:`measure` of a pool benchmark round (``env_steps`` env steps per call of ``fn``),
    plus where the CPU time went, per env step, over the timed repeats:

    * ``serial_ns``: the calling thread (Python, argument and result conversion with the GIL held,
      dispatch, waiting excluded). Nothing else runs on it, so it does not scale with threads.
    * ``worker_ns``: the pool's worker threads (the parallel part).
    * ``serial_share`` = serial / (serial + worker). CPU time, unlike wall time, stays meaningful
      on a loaded machine: by Amdahl, 2 threads can reach at most ``1 / (s + (1 - s) / 2)``.
    """
    cpu = {}

    def timed() -> None:
        m0, w0 = time.thread_time_ns(), pool_worker_cpu_by_thread()
        fn()
        m1, w1 = time.thread_time_ns(), pool_worker_cpu_by_thread()
        cpu["serial"] = cpu.get("serial", 0) + (m1 - m0)
        if w0 is not None and w1 is not None:
            cpu["worker"] = cpu.get("worker", 0) + _worker_cpu_delta(w0, w1)

    fn()  # warm-up, untimed and not counted
    m = measure(timed, repeats, warmup=0)
    steps = env_steps * repeats
    m["serial_ns"] = cpu["serial"] / steps
    m["worker_ns"] = cpu["worker"] / steps if "worker" in cpu else float("nan")
    total = m["serial_ns"] + m["worker_ns"]
    m["serial_share"] = m["serial_ns"] / total if total > 0 else float("nan")
    return m


def amdahl(serial_share: float, threads: int) -> float:
    """Speed-up bound of ``threads`` threads over one for a serial share ``s``: 1 / (s + (1 - s) / t)."""
    return 1.0 / (serial_share + (1.0 - serial_share) / threads)


def rel_spread(m: dict) -> float:
    return m["spread_s"] / m["median_s"] if m["median_s"] > 0 else 0.0


def fmt(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, float):
        if v != v:
            return "-"
        a = abs(v)
        if a >= 1e5:
            return f"{v:,.0f}"
        if a >= 100:
            return f"{v:.0f}"
        if a >= 1:
            return f"{v:.2f}"
        return f"{v:.3g}"
    return str(v)


def emit(
    name: str,
    title: str,
    rows: list[dict],
    cols: Sequence[str],
    out_dir: Path,
    args: argparse.Namespace,
    notes: Sequence[str] = (),
    plot: Callable[[Any, list[dict]], None] | None = None,
) -> dict:
    """Print the machine line and a rich table; write ``<name>.json`` and ``<name>.png``."""
    from rich.console import Console
    from rich.table import Table

    machine = machine_line()
    cols = [c for c in cols if any(c in r for r in rows)]
    width = sum(max([len(c)] + [len(fmt(r.get(c, ""))) for r in rows]) + 3 for c in cols) + 4
    console = Console(width=max(120, width), soft_wrap=False)
    table = Table(title=f"{title}\nmachine: {machine}", title_justify="left")
    for c in cols:
        table.add_column(c, justify="right", no_wrap=True)
    for r in rows:
        table.add_row(*[fmt(r.get(c, "")) for c in cols])
    console.print(table)
    for n in notes:
        console.print(f"note: {n}")
    out_dir.mkdir(parents=True, exist_ok=True)
    payload = dict(
        benchmark=name,
        machine=machine,
        args={k: v for k, v in vars(args).items() if k != "func"},
        rows=rows,
        notes=list(notes),
    )
    (out_dir / f"{name}.json").write_text(json.dumps(payload, indent=2, default=str))
    if plot is not None and rows:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        plot(ax, rows)
        ax.set_title(f"{title}\n{machine}", fontsize=7)
        fig.tight_layout()
        fig.savefig(out_dir / f"{name}.png", dpi=110)
        plt.close(fig)
    return payload


def bar(ax, labels, values, ylabel, log=False):
    ax.bar(range(len(values)), values)
    ax.set_xticks(range(len(values)))
    ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=7)
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")


def pos_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {s!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {s!r}")
    return v


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="bench-results", help="output folder for JSON and PNG (default bench-results/)")
    p.add_argument("--quick", action="store_true", help="small sizes (the whole `all` in < 10 min on 2 cores)")
    p.add_argument("--tiny", action="store_true", help="tiny sizes for smoke tests (seconds)")
    p.add_argument("--repeats", type=pos_int, default=None, help="timed repeats after one warm-up")


def fill_defaults(defaults: dict[str, tuple], args: argparse.Namespace) -> argparse.Namespace:
    """Sets every argument left unset to its size level: (full, --quick, --tiny)."""
    level = 2 if args.tiny else (1 if args.quick else 0)
    for key, vals in defaults.items():
        if getattr(args, key, None) is None:
            setattr(args, key, vals[level])
    return args
