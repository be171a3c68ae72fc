"""Rollout benchmarks CLI: ``python -m pcsd.bench {op,env,prompts,logprobs,rollout,all}``.

Every subcommand runs both sides of each comparison in the same invocation, after a warm-up,
``--repeats`` times, and reports the median and the spread (max - min). Each prints a rich table
headed by the machine line (CPU model, cores, GPU, torch version) and writes
``<out>/<name>.json`` (machine, arguments, rows) and ``<out>/<name>.png`` (matplotlib, Agg).

    python -m pcsd.bench all --quick            # everything at small sizes (< 10 min on 2 cores)
    python -m pcsd.bench env --sizes 128 1024 4096 --threads 1 2
    python -m pcsd.bench logprobs --tokens 2048 --hidden 64
    python -m pcsd.bench rollout --model-path /models/Qwen2.5-3B-Instruct   # CUDA GPU only: real model

``env`` sets the native pool against the real alfworld engine stepped one env at a time and in a
Python multiprocessing pool (worker processes holding real envs); ``rollout`` sets the vLLM
backend against HF. With a CUDA GPU, ``op`` and ``logprobs`` add CUDA rows and ``rollout
--model-path`` measures the given model's generation tokens/s and rollout split on the GPU.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    # vLLM's CPU build wants one OpenMP thread per process; it must be set before torch loads.
    import importlib.util as _ilu

    if _ilu.find_spec("vllm") is not None:
        os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable, Sequence  # noqa: E402

import torch  # noqa: E402

__all__ = ["amdahl", "machine_line", "measure", "measure_pool", "make_segments", "main", "pool_worker_cpu_ns"]

SUBCOMMANDS = ("op", "env", "prompts", "logprobs", "rollout")
FULL_VOCAB = 151_936  # Qwen2.5 / Qwen3 vocabulary


# ----------------------------------------------------------------------------------------------
# shared helpers
# ----------------------------------------------------------------------------------------------
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
    return dict(median_s=statistics.median(times), min_s=min(times), max_s=max(times),
                spread_s=max(times) - min(times), times_s=times)


POOL_THREAD_PREFIX = "pcsd-envpool-"  # the native pool names its worker threads pcsd-envpool-<i>


def pool_worker_cpu_ns() -> int | None:
    """CPU time (ns) used so far by this process's env-pool worker threads, from Linux
    ``/proc/self/task/*/schedstat``; None where that is not available."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    total = 0
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if not f.read().startswith(POOL_THREAD_PREFIX):
                    continue
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # the thread exited meanwhile
    return total


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
        m0, w0 = time.thread_time_ns(), pool_worker_cpu_ns()
        fn()
        m1, w1 = time.thread_time_ns(), pool_worker_cpu_ns()
        cpu["serial"] = cpu.get("serial", 0) + (m1 - m0)
        if w0 is not None and w1 is not None:
            cpu["worker"] = cpu.get("worker", 0) + (w1 - w0)

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


def _rel_spread(m: dict) -> float:
    return m["spread_s"] / m["median_s"] if m["median_s"] > 0 else 0.0


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


def _fmt(v: Any) -> str:
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


def emit(name: str, title: str, rows: list[dict], cols: Sequence[str], out_dir: Path, args: argparse.Namespace,
         notes: Sequence[str] = (), plot: Callable[[Any, list[dict]], None] | None = None) -> dict:
    """Print the machine line and a rich table; write ``<name>.json`` and ``<name>.png``."""
    from rich.console import Console
    from rich.table import Table

    machine = machine_line()
    cols = [c for c in cols if any(c in r for r in rows)]
    width = sum(max([len(c)] + [len(_fmt(r.get(c, ""))) for r in rows]) + 3 for c in cols) + 4
    console = Console(width=max(120, width), soft_wrap=False)
    table = Table(title=f"{title}\nmachine: {machine}", title_justify="left")
    for c in cols:
        table.add_column(c, justify="right", no_wrap=True)
    for r in rows:
        table.add_row(*[_fmt(r.get(c, "")) for c in cols])
    console.print(table)
    for n in notes:
        console.print(f"note: {n}")
    out_dir.mkdir(parents=True, exist_ok=True)
    payload = dict(benchmark=name, machine=machine, args={k: v for k, v in vars(args).items() if k != "func"},
                   rows=rows, notes=list(notes))
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


def _bar(ax, labels, values, ylabel, log=False):
    ax.bar(range(len(values)), values)
    ax.set_xticks(range(len(values)))
    ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=7)
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")


# ----------------------------------------------------------------------------------------------
# op: native PCSD weights kernel vs eager / compiled reference vs a plain copy
# ----------------------------------------------------------------------------------------------
def bench_op(tokens: Sequence[int], threads: Sequence[int], repeats: int, compile_ref: bool,
             device: str = "cpu") -> tuple[list[dict], list[str]]:
    from pcsd.ops import kernel_for, pcsd_weights
    from pcsd.reference import pcsd_weights_reference

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
            row = dict(device=device, kernel=kernel_for(gap.device), tokens=total, threads=nt,
                       native_ms=m_nat["median_s"] * 1e3, native_spread_ms=m_nat["spread_s"] * 1e3,
                       eager_ms=m_ref["median_s"] * 1e3, eager_spread_ms=m_ref["spread_s"] * 1e3,
                       copy_ms=m_cp["median_s"] * 1e3,
                       speedup_vs_eager=m_ref["median_s"] / m_nat["median_s"],
                       native_GBps=nbytes / m_nat["median_s"] / 1e9, copy_GBps=nbytes / m_cp["median_s"] / 1e9,
                       bandwidth_vs_copy=m_cp["median_s"] / m_nat["median_s"], max_abs_err_vs_ref=max_err)
            if compiled is not None:
                m_c = measure(lambda: compiled(gap, cu, mask), repeats, sync=sync)
                row.update(compiled_ms=m_c["median_s"] * 1e3, compiled_spread_ms=m_c["spread_s"] * 1e3,
                           speedup_vs_compiled=m_c["median_s"] / m_nat["median_s"])
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
    cols = ["device", "kernel", "tokens", "threads", "native_ms", "native_spread_ms", "eager_ms", "eager_spread_ms",
            "compiled_ms", "speedup_vs_eager", "speedup_vs_compiled", "native_GBps", "copy_GBps",
            "bandwidth_vs_copy", "max_abs_err_vs_ref"]

    def plot(ax, rows):
        labels = [f"{r['device']} {r['tokens']:,}t {r['threads']}thr" for r in rows]
        ax.plot(labels, [r["native_GBps"] for r in rows], "o-", label="native kernel")
        ax.plot(labels, [r["copy_GBps"] for r in rows], "s--", label="plain copy")
        ax.set_ylabel("GB/s")
        ax.legend()
        ax.tick_params(axis="x", labelsize=7, rotation=30)

    return emit("op", "PCSD weights op: native kernel vs eager / torch.compile reference", rows, cols,
                Path(args.out), args, notes, plot)


# ----------------------------------------------------------------------------------------------
# env: native env pool vs the real alfworld engine
# ----------------------------------------------------------------------------------------------
_SAFE_PREFIXES = ("go to ", "examine ", "look", "inventory")  # never win, so episodes run to the limit


def make_games(dirpath: Path, count: int, seed: int = 0) -> list[str]:
    """``count`` procedural games (task types round-robin) under ``dirpath``."""
    from pcsd.envs.procedural import TASK_TYPES, write_game

    return [str(write_game(dirpath / f"g{i:04d}" / "game.tw-pddl", TASK_TYPES[i % len(TASK_TYPES)], seed + i))
            for i in range(count)]


def command_streams(games: Sequence[str], length: int) -> list[list[str]]:
    """A deterministic command stream per game, recorded on the native engine: at step k the
    ``k``-th safe command (go to / examine / look / inventory) of the sorted admissible list."""
    from pcsd.envs.pool import EnvPool

    streams = []
    with EnvPool("alfworld", len(games), games=list(games), max_steps=None, num_threads=1) as pool:
        b = pool.reset()
        adm = dict(zip(b.env_id.tolist(), b.admissible))
        cmds: list[list[str]] = [[] for _ in games]
        for k in range(length):
            acts = []
            for e in range(len(games)):
                safe = sorted(a for a in adm[e] if a.startswith(_SAFE_PREFIXES))
                acts.append(safe[(k * 7 + e) % len(safe)])
            for e, a in enumerate(acts):
                cmds[e].append(a)
            b = pool.step(acts)
            adm = dict(zip(b.env_id.tolist(), b.admissible))
        streams = cmds
    return streams


def _native_sync(games, streams, num_envs, group, threads, steps, repeats):
    from pcsd.envs.pool import EnvPool

    L = len(streams[0])
    n_groups = num_envs // group
    gi = [g % len(games) for g in range(n_groups)]
    pool = EnvPool("alfworld", num_envs, group_size=group, games=[games[i] for i in gi], max_steps=L,
                   num_threads=threads, auto_reset=True)
    pool.reset()
    k = [0]
    # actions per step index: env e plays streams[game of its group][k mod (L+1)]; index L is the
    # auto-reset step (action ignored).
    per_k = [[streams[gi[e // group]][min(j, L - 1)] for e in range(num_envs)] for j in range(L + 1)]

    def once():
        for _ in range(steps):
            b = pool.step(per_k[k[0] % (L + 1)])
            k[0] += 1
            if b.error[0]:
                raise RuntimeError(f"native pool error: {b.error[0]}")

    m = measure_pool(once, repeats, steps * num_envs)
    pool.close()
    return m


def _native_async(games, streams, num_envs, group, threads, steps, repeats):
    from pcsd.envs.pool import EnvPool

    L = len(streams[0])
    n_groups = num_envs // group
    gi = [g % len(games) for g in range(n_groups)]
    pool = EnvPool("alfworld", num_envs, group_size=group, games=[games[i] for i in gi], max_steps=L,
                   num_threads=threads, auto_reset=True)
    pool.send_reset(range(num_envs))
    k = [0] * num_envs
    batch = max(1, num_envs // 2)

    def once():
        done = 0
        while done < steps * num_envs:
            b = pool.recv(batch)
            ids = b.env_id.tolist()
            acts = []
            for e in ids:
                acts.append(streams[gi[e // group]][min(k[e] % (L + 1), L - 1)])
                k[e] += 1
            pool.send(acts, ids)
            done += len(ids)

    m = measure_pool(once, repeats, steps * num_envs)
    pool.recv()
    pool.close()
    return m


def _start_real_env(game: str):
    """One real alfworld env: TextWorld's PDDL engine with alfworld's wrappers, as alfworld's
    ``AlfredTWEnv`` builds it (``AlfredDemangler(shuffle=False)`` + ``AlfredInfos``)."""
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos

    infos = textworld.EnvInfos(won=True, admissible_commands=True)
    return textworld.start(game, infos, wrappers=[AlfredDemangler(shuffle=False), AlfredInfos])


def _real_result(state) -> tuple[str, bool, list[str]]:
    return state.feedback, bool(state.get("won")), list(state.get("admissible_commands") or [])


def _mp_worker(conn, games: list[str]) -> None:
    """Body of one worker process of :class:`RealEnvProcessPool`: holds one real env per entry of
    ``games``; each message is one command per env (``None`` = reset) and is answered with one
    ``(observation, won, admissible)`` per env, what an agent needs for its next prompt."""
    envs = []
    try:
        envs = [_start_real_env(g) for g in games]
        conn.send(("ok", [_real_result(env.reset()) for env in envs]))
        while True:
            cmds = conn.recv()
            if cmds is None:
                break
            out = []
            for env, cmd in zip(envs, cmds):
                out.append(_real_result(env.reset() if cmd is None else env.step(cmd)[0]))
            conn.send(("ok", out))
    except (EOFError, KeyboardInterrupt):
        pass
    except Exception as exc:  # reported to the parent, which raises it
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        for env in envs:
            env.close()
        conn.close()


class RealEnvProcessPool:
    """A Python ``multiprocessing`` pool of real alfworld envs: ``workers`` processes, each holding
    a contiguous slice of the envs (what one-actor-per-env setups amount to once actors share a
    core). ``step`` is synchronous (every worker steps its slice, the parent waits for all);
    ``send``/``recv_any`` let the parent serve whichever worker answers first (async)."""

    def __init__(self, games: Sequence[str], workers: int, start_timeout_s: float = 600.0):
        import multiprocessing as mp

        if workers < 1 or workers > len(games):
            raise ValueError(f"workers: expected 1..{len(games)} (one env at least per worker), got {workers}")
        # fork: the children inherit the imported engine (spawn would re-import torch per worker)
        ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
        bounds = [round(i * len(games) / workers) for i in range(workers + 1)]
        self.slices = [list(range(bounds[i], bounds[i + 1])) for i in range(workers)]
        self.conns, self.procs = [], []
        for sl in self.slices:
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_mp_worker, args=(child, [games[e] for e in sl]), daemon=True)
            p.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(p)
        try:
            for w, c in enumerate(self.conns):
                if not c.poll(start_timeout_s):
                    raise RuntimeError(f"real-env worker {w} did not start within {start_timeout_s:.0f} s")
                self._unwrap(w, c.recv())
        except BaseException:
            self.close()
            raise

    def _unwrap(self, w: int, msg):
        status, payload = msg
        if status != "ok":
            raise RuntimeError(f"real-env worker {w} failed: {payload}")
        return payload

    def send(self, w: int, cmds: Sequence[str | None]) -> None:
        self.conns[w].send(list(cmds))

    def recv(self, w: int) -> list:
        return self._unwrap(w, self.conns[w].recv())

    def recv_any(self) -> list[tuple[int, list]]:
        """Wait until at least one worker has answered; returns ``(worker, results)`` for each."""
        from multiprocessing.connection import wait

        ready = wait(self.conns)
        return [(self.conns.index(c), self.recv(self.conns.index(c))) for c in ready]

    def step(self, cmds: Sequence[str | None]) -> list:
        for w, sl in enumerate(self.slices):
            self.send(w, [cmds[e] for e in sl])
        out = []
        for w in range(len(self.slices)):
            out += self.recv(w)
        return out

    def close(self) -> None:
        for c in self.conns:
            try:
                c.send(None)
            except (BrokenPipeError, OSError):
                pass
        for p in self.procs:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
                p.join()
        for c in self.conns:
            c.close()
        self.conns, self.procs = [], []


def _real_mp_rates(games, streams, num_envs, workers, steps, repeats) -> tuple[dict, dict]:
    """Sync and async measures of ``steps`` steps per env on a :class:`RealEnvProcessPool` of
    ``num_envs`` real envs (env ``e`` plays game ``e % len(games)`` with its command stream and the
    native pool's reset rule: a reset after every ``len(stream)`` commands)."""
    L = len(streams[0])
    game_of = [e % len(games) for e in range(num_envs)]
    pool = RealEnvProcessPool([games[g] for g in game_of], workers)
    k = [0] * num_envs

    def cmd(e):
        j = k[e] % (L + 1)
        k[e] += 1
        return None if j == L else streams[game_of[e]][j]

    try:
        def sync_once():
            for _ in range(steps):
                pool.step([cmd(e) for e in range(num_envs)])

        ms = measure(sync_once, repeats)

        for w, sl in enumerate(pool.slices):  # async: every worker always has a request in flight
            pool.send(w, [cmd(e) for e in sl])

        def async_once():
            done = 0
            while done < steps * num_envs:
                for w, res in pool.recv_any():
                    done += len(res)
                    pool.send(w, [cmd(e) for e in pool.slices[w]])

        ma = measure(async_once, repeats)
        for w in range(len(pool.slices)):
            pool.recv(w)
    finally:
        pool.close()
    return ms, ma


def _real_engine_rate(games, streams, steps, repeats) -> tuple[dict, float]:
    """The alfworld engine (textworld PDDL + AlfredDemangler/AlfredInfos), one env after another,
    playing the same streams with the same reset rule. Returns (measure of ``steps`` steps, reset
    seconds median)."""
    envs = [_start_real_env(g) for g in games]
    L = len(streams[0])
    k = [0] * len(envs)
    reset_times = []
    for env in envs:
        t0 = time.perf_counter()
        env.reset()
        reset_times.append(time.perf_counter() - t0)
    turn = [0]

    def once():
        for _ in range(steps):
            e = turn[0] % len(envs)
            turn[0] += 1
            j = k[e] % (L + 1)
            k[e] += 1
            if j == L:
                t0 = time.perf_counter()
                envs[e].reset()
                reset_times.append(time.perf_counter() - t0)
            else:
                envs[e].step(streams[e][j])

    m = measure(once, repeats)
    for env in envs:
        env.close()
    return m, statistics.median(reset_times)


def cmd_env(args) -> dict:
    import importlib.util

    ncpu = os.cpu_count() or 1
    threads = args.threads or sorted({1, ncpu} | {t for t in (2, 4, 8, 16) if t < ncpu})
    notes = []
    rows = []
    with tempfile.TemporaryDirectory(prefix="pcsd-bench-env-") as tmp:
        games = make_games(Path(tmp), args.games)
        streams = command_streams(games, args.stream_len)
        cycle = args.stream_len + 1  # one episode: stream_len commands, then the reset
        steps = args.steps or cycle
        for n in args.sizes:
            group = min(args.group_size, n)
            if n % group:
                raise SystemExit(f"error: --sizes: {n} is not a multiple of --group-size {group}")
            for t in threads:
                ms = _native_sync(games, streams, n, group, t, steps, args.repeats)
                ma = _native_async(games, streams, n, group, t, steps, args.repeats)
                total = n * steps
                rows.append(dict(engine="native pool", envs=n, threads=t,
                                 sync_steps_per_s=total / ms["median_s"], sync_spread_rel=_rel_spread(ms),
                                 async_steps_per_s=total / ma["median_s"], async_spread_rel=_rel_spread(ma),
                                 sync_per_core=total / ms["median_s"] / t,
                                 async_vs_sync=ms["median_s"] / ma["median_s"],
                                 sync_serial_ns=ms["serial_ns"], sync_worker_ns=ms["worker_ns"],
                                 sync_serial_share=ms["serial_share"], async_serial_ns=ma["serial_ns"],
                                 async_worker_ns=ma["worker_ns"], async_serial_share=ma["serial_share"],
                                 load=os.getloadavg()[0]))
        missing = [p for p in ("alfworld", "textworld") if importlib.util.find_spec(p) is None]
        if args.no_real:
            notes.append("real alfworld engine columns skipped: --no-real")
        elif missing:
            notes.append(f"real alfworld engine columns skipped: package(s) {missing} not importable")
        else:
            n_real = min(args.real_games, len(games))
            real_steps = args.real_steps or n_real * cycle
            mr, reset_s = _real_engine_rate(games[:n_real], streams[:n_real], real_steps, args.repeats)
            real_rate = real_steps / mr["median_s"]
            rows.append(dict(engine="alfworld, 1 env at a time", envs=n_real, threads=1,
                             sync_steps_per_s=real_rate, sync_spread_rel=_rel_spread(mr), sync_per_core=real_rate,
                             reset_s=reset_s))
            n_mp = max(args.mp_envs, max(threads))
            mp_steps = args.mp_steps or cycle
            for w in threads:
                ms, ma = _real_mp_rates(games, streams, n_mp, w, mp_steps, args.repeats)
                total = n_mp * mp_steps
                rows.append(dict(engine="alfworld mp pool", envs=n_mp, threads=w,
                                 sync_steps_per_s=total / ms["median_s"], sync_spread_rel=_rel_spread(ms),
                                 async_steps_per_s=total / ma["median_s"], async_spread_rel=_rel_spread(ma),
                                 sync_per_core=total / ms["median_s"] / min(w, ncpu),
                                 async_vs_sync=ms["median_s"] / ma["median_s"]))
            mp_rows = {r["threads"]: r for r in rows if r["engine"] == "alfworld mp pool"}
            for r in rows:
                if r["engine"] == "native pool":
                    r["per_core_vs_real"] = r["sync_per_core"] / real_rate
                    r["sync_vs_real"] = r["sync_steps_per_s"] / real_rate
                    m = mp_rows[r["threads"]]
                    r["sync_vs_mp"] = r["sync_steps_per_s"] / m["sync_steps_per_s"]
                    r["async_vs_mp"] = r["async_steps_per_s"] / m["async_steps_per_s"]
            notes.append(f"the real-engine rows are measured on fewer envs (their `envs` column) than the native pool "
                         f"and compared per env-step: the single engine steps {n_real} game(s) one after another "
                         f"({real_steps} steps per repeat, median reset {reset_s:.3f} s); the mp pool holds "
                         f"{n_mp} real envs split over `threads` worker processes (multiprocessing, fork, pipes; "
                         f"env e plays game e mod {len(games)}), {mp_steps} steps per env per repeat, async = "
                         "serve whichever worker answers first; per core = steps/s / min(workers, cores)")
            notes.append("sync_vs_mp / async_vs_mp: native pool vs the mp pool with as many worker processes as "
                         "the pool has threads")
    for r in rows:  # scaling from the fewest threads / worker processes, per engine and size
        if "async_steps_per_s" in r:
            b = min((x for x in rows if x["engine"] == r["engine"] and x["envs"] == r["envs"]),
                    key=lambda x: x["threads"])
            r["sync_scaling_vs_1thr"] = r["sync_steps_per_s"] / b["sync_steps_per_s"]
            r["async_scaling_vs_1thr"] = r["async_steps_per_s"] / b["async_steps_per_s"]
            if "sync_serial_share" in b and r["threads"] > b["threads"]:  # what the 1-thread CPU split allows
                r["sync_amdahl_bound"] = amdahl(b["sync_serial_share"], r["threads"] // b["threads"])
                r["async_amdahl_bound"] = amdahl(b["async_serial_share"], r["threads"] // b["threads"])
    notes.append(f"{len(games)} procedural games, groups of {args.group_size} envs, command streams of "
                 f"{args.stream_len} safe commands then a reset (in every engine); native: {steps} steps per "
                 "env per repeat; threads = pool threads (native) or worker processes (mp pool)")
    notes.append("CPU split of the native pool, per env step: serial_ns = the calling thread (Python, argument and "
                 "result conversion with the GIL held, dispatch; it never runs in parallel), worker_ns = the pool's "
                 "worker threads; serial_share = serial / (serial + worker). CPU time stays meaningful on a loaded "
                 "machine, where wall-time scaling does not (see `load`, the 1-minute load average); "
                 "*_amdahl_bound = 1 / (s + (1 - s) / k) for k times the threads, s from the fewest-threads row")
    cols = ["engine", "envs", "threads", "sync_steps_per_s", "sync_spread_rel", "async_steps_per_s",
            "async_spread_rel", "async_vs_sync", "sync_per_core", "sync_scaling_vs_1thr", "async_scaling_vs_1thr",
            "sync_serial_ns", "sync_worker_ns", "sync_serial_share", "async_serial_ns", "async_worker_ns",
            "async_serial_share", "sync_amdahl_bound", "async_amdahl_bound", "load",
            "per_core_vs_real", "sync_vs_real", "sync_vs_mp", "async_vs_mp", "reset_s"]

    def plot(ax, rows):
        for n in sorted({r["envs"] for r in rows if r["engine"] == "native pool"}):
            rs = [r for r in rows if r["engine"] == "native pool" and r["envs"] == n]
            x = [r["threads"] for r in rs]
            ax.plot(x, [r["sync_steps_per_s"] for r in rs], "o-", label=f"native sync {n} envs")
            ax.plot(x, [r["async_steps_per_s"] for r in rs], "s--", label=f"native async {n} envs")
        rs = [r for r in rows if r["engine"] == "alfworld mp pool"]
        if rs:
            ax.plot([r["threads"] for r in rs], [r["sync_steps_per_s"] for r in rs], "o-", color="red",
                    label=f"alfworld mp pool sync ({rs[0]['envs']} envs)")
            ax.plot([r["threads"] for r in rs], [r["async_steps_per_s"] for r in rs], "s--", color="red",
                    label="alfworld mp pool async")
        for r in rows:
            if r["engine"] == "alfworld, 1 env at a time":
                ax.axhline(r["sync_steps_per_s"], color="black", ls=":", label="alfworld, 1 env at a time")
        ax.set_xlabel("threads (native) / worker processes (mp pool)")
        ax.set_ylabel("env steps/s")
        ax.set_yscale("log")
        ax.legend(fontsize=6)

    payload = emit("env", "Env pool: native alfworld engine vs the real alfworld engine (alone and in a "
                   "multiprocessing pool)", rows, cols, Path(args.out), args, notes, plot)
    webshop_root = args.webshop or os.environ.get("WEBSHOP_DATA")
    if webshop_root:
        payload["webshop"] = cmd_env_webshop(Path(webshop_root), args)
    return payload


def cmd_env_webshop(root: Path, args) -> dict:
    """WebShop rows: native per step by action kind vs the original's recorded per-step times, and
    a synthetic-catalogue scale row."""
    from pcsd import bench_webshop

    rows = bench_webshop.per_kind_rows(root, max(1, args.repeats))
    rows.append(bench_webshop.scale_row(root, args.webshop_products))
    notes = ["original_ms: median per env.step of princeton-nlp/WebShop (pyserini/Lucene, spaCy, Flask templates, "
             "bs4) recorded with the same actions in traces_public.jsonl.gz on a 2-core machine (FACTS.md); native_us: "
             "the same steps through pcsd.envs.webshop (Python call included), median over the replays; speedup = "
             "original / native per step on one core",
             "scale row: the 1k products repeated with new ASINs and varied titles; load_and_index_s = streaming "
             "JSON load + index build + goal generation; rss_added_mib = resident memory added by the load; "
             "search = WebShop.search on goal instructions (analyzer + BM25 + top 50)"]
    cols = ["engine", "action", "steps", "native_us", "original_ms", "speedup", "products", "goals",
            "load_and_index_s", "rss_added_mib", "search_median_us", "search_p90_us", "original_lucene_query_ms"]
    return emit("env_webshop", "WebShop: native engine per step vs the original, and a large catalogue", rows, cols,
                Path(args.out), args, notes)


# ----------------------------------------------------------------------------------------------
# prompts: Rust encode_batch vs Python str.format + transformers apply_chat_template
# ----------------------------------------------------------------------------------------------
_INSTR = ("You should first reason step-by-step about the current situation. This reasoning process MUST be "
          "enclosed within <think> </think> tags.\nOnce you've finished your reasoning, you should choose an "
          "admissible action for current step and present it within <action> </action> tags.")
PY_ALFWORLD_TEMPLATE = (
    "You are an expert agent operating in the ALFRED Embodied Environment. Your task is to: {task_description}\n\n"
    "Prior to this step, you have already taken {step_count} step(s). Below are the most recent {history_length} "
    "observations and the corresponding actions you took: {action_history}\n\n"
    "You are now at step {current_step} and your current observation is: {current_observation}\n\n"
    "Your admissible actions of the current situation are: [{admissible_actions}].\n\n"
    "Now it's your turn to take an action.\n{instructions}")
PY_ALFWORLD_TEMPLATE_NO_HIS = (
    "You are an expert agent operating in the ALFRED Embodied Environment. Your task is to: {task_description}\n\n"
    "Your current observation is: {current_observation}\n\n"
    "Your admissible actions of the current situation are: [{admissible_actions}].\n\n"
    "Now it's your turn to take an action.\n{instructions}")


def python_prompt(req: dict, history_length: int) -> str:
    """The ALFWorld student prompt with ``str.format`` (same text as the Rust templates)."""
    adm = "\n ".join(f"'{a}'" for a in req["admissible"] if a.strip() != "help")
    step = req["step"]
    if step == 0 or history_length == 0:
        return PY_ALFWORLD_TEMPLATE_NO_HIS.format(task_description=req["task"].strip(),
                                                  current_observation=req["observation"].strip(),
                                                  admissible_actions=adm, instructions=_INSTR)
    recent = req["history"][max(0, len(req["history"]) - history_length):]
    first = max(step + 1 - len(recent), 1)
    hist = "\n".join(f"[Observation {first + j}: '{o}', Action {first + j}: '{a}']" for j, (o, a) in enumerate(recent))
    return PY_ALFWORLD_TEMPLATE.format(task_description=req["task"].strip(), step_count=step,
                                       history_length=len(recent), action_history=hist, current_step=step + 1,
                                       current_observation=req["observation"].strip(), admissible_actions=adm,
                                       instructions=_INSTR)


def prompt_stream(games: Sequence[str], group_size: int, turns: int, seed: int = 0) -> list[list[dict]]:
    """The prompt requests of a live rollout, turn by turn: ``len(games) * group_size`` envs
    (GRPO groups: the envs of a group play the same game) take seeded random admissible actions
    (``help`` aside); turn ``k`` holds one request per env (task, observation, admissible,
    history, step), so observations, admissible lists and histories are new every turn. An env
    whose episode ends is reset and starts a new one (empty history)."""
    import random

    from pcsd.envs.pool import EnvPool

    rng = random.Random(seed)
    n = len(games) * group_size
    stream = []
    with EnvPool("alfworld", n, group_size=group_size, games=list(games), max_steps=None, num_threads=1) as pool:
        b = pool.reset()
        tasks = [pool.task_of(e)[1] for e in range(n)]
        obs, adm = list(b.obs), [list(a) for a in b.admissible]
        hist: list[list[tuple[str, str]]] = [[] for _ in range(n)]
        for _ in range(turns):
            stream.append([dict(task=tasks[e], observation=obs[e], admissible=adm[e], history=list(hist[e]),
                                step=len(hist[e])) for e in range(n)])
            acts = [rng.choice([a for a in adm[e] if a != "help"]) for e in range(n)]
            b = pool.step(acts)
            for e in range(n):
                hist[e].append((obs[e], acts[e]))
            obs, adm = list(b.obs), [list(a) for a in b.admissible]
            ended = [e for e in range(n) if b.done[e]]
            if ended:
                r = pool.reset(ended)
                for k, e in enumerate(ended):
                    obs[e], adm[e], hist[e] = r.obs[k], list(r.admissible[k]), []
    return stream


_PY_TOKENIZER: Any = None


def _py_prompt_init(model_dir: str) -> None:
    global _PY_TOKENIZER
    from transformers import AutoTokenizer

    _PY_TOKENIZER = AutoTokenizer.from_pretrained(model_dir)


def python_prompt_ids(reqs: Sequence[dict]) -> list[list[int]]:
    """The Python side: ``str.format`` of the template + ``apply_chat_template(...,
    add_generation_prompt=True, tokenize=True)``, one prompt after another (tokenizer set by
    :func:`_py_prompt_init`)."""
    out = []
    for r in reqs:
        ids = _PY_TOKENIZER.apply_chat_template([{"role": "user", "content": python_prompt(r, 2)}],
                                                add_generation_prompt=True, tokenize=True)
        out.append(list(ids if isinstance(ids, list) else ids["input_ids"]))  # transformers 5: BatchEncoding
    return out


def _stream_times(run_turn: Callable[[list[dict]], Any], stream: list[list[dict]], repeats: int,
                  fresh: Callable[[], Any] = lambda: None) -> dict:
    """Per repeat (``fresh()`` first): the first turn's time (cold) and the later turns' total
    (steady state), wall and process CPU; medians over the repeats."""
    cold, steady, cold_cpu, steady_cpu = [], [], [], []
    for _ in range(repeats):
        fresh()
        turns = []  # (wall, CPU) seconds per turn
        for reqs in stream:
            w0, c0 = time.perf_counter(), time.process_time()
            run_turn(reqs)
            turns.append((time.perf_counter() - w0, time.process_time() - c0))
        cold.append(turns[0][0])
        cold_cpu.append(turns[0][1])
        if len(turns) > 1:
            steady.append(sum(w for w, _ in turns[1:]))
            steady_cpu.append(sum(c for _, c in turns[1:]))
    med = statistics.median
    return dict(cold_s=med(cold), steady_s=med(steady) if steady else float("nan"), cold_cpu_s=med(cold_cpu),
                steady_cpu_s=med(steady_cpu) if steady_cpu else float("nan"),
                cold_spread_rel=(max(cold) - min(cold)) / med(cold))


def cmd_prompts(args) -> dict:
    import multiprocessing as mp

    from pcsd.prompts import PromptBuilder
    from pcsd.testing import make_tiny_model

    notes = []
    rows = []
    ncpu = os.cpu_count() or 1
    threads = args.threads or sorted({1, ncpu})
    with tempfile.TemporaryDirectory(prefix="pcsd-bench-prompts-") as tmp:
        model_dir = str(make_tiny_model(Path(tmp) / "model"))
        group = min(args.group_size, args.envs)
        if args.envs % group:
            raise SystemExit(f"error: --envs: {args.envs} is not a multiple of --group-size {group}")
        games = make_games(Path(tmp) / "games", args.envs // group)
        stream = prompt_stream(games, group, args.turns)
        n = len(stream[0])
        _py_prompt_init(model_dir)

        def builder(t: int) -> PromptBuilder:
            return PromptBuilder("alfworld", history_length=2, max_prompt_tokens=None, tokenizer_dir=model_dir,
                                 num_threads=t)

        # same texts and ids on the first and the last turn (a fresh builder, then the one that saw the stream)
        check = [stream[0], stream[-1]]
        b = builder(1)
        for reqs in stream:
            out = b.build_batch(reqs)
            if reqs is stream[0]:
                first = out
        rust_out = first + out
        texts_equal = all(python_prompt(r, 2) == t for r, (t, _) in zip(check[0] + check[1], rust_out))
        ids_equal = python_prompt_ids(check[0] + check[1]) == [list(i) for _, i in rust_out]
        ntok = sum(len(i) for _, i in out) / n
        for t in threads:
            state: dict = {}
            rust = _stream_times(lambda reqs: state["b"].encode_batch(reqs), stream, args.repeats,
                                 fresh=lambda: state.update(b=builder(t)))
            if t == 1:
                py = _stream_times(python_prompt_ids, stream, args.repeats)
            else:  # the same cores for Python: t worker processes, each a contiguous share of the batch
                with mp.get_context("spawn").Pool(t, initializer=_py_prompt_init, initargs=(model_dir,)) as procs:
                    procs.map(python_prompt_ids, [stream[0][:1]] * t)  # start-up and imports, untimed

                    def py_turn(reqs: list[dict]) -> list:
                        k = -(-len(reqs) // t)
                        return procs.map(python_prompt_ids, [reqs[i:i + k] for i in range(0, len(reqs), k)])

                    py = _stream_times(py_turn, stream, args.repeats)
            for phase, key, count in (("cold: turn 1", "cold", n), (f"steady: turns 2-{len(stream)}", "steady",
                                                                     n * (len(stream) - 1))):
                r, p = rust[f"{key}_s"], py[f"{key}_s"]
                row = dict(threads=t, phase=phase, rust_prompts_per_s=count / r, python_prompts_per_s=count / p,
                           speedup=p / r)
                if t == 1:  # CPU time: the like-for-like figure on a loaded machine
                    rc, pc = rust[f"{key}_cpu_s"], py[f"{key}_cpu_s"]
                    row.update(rust_cpu_us_per_prompt=1e6 * rc / count, python_cpu_us_per_prompt=1e6 * pc / count,
                               cpu_speedup=pc / rc)
                row.update(mean_prompt_tokens=ntok, texts_equal=texts_equal, ids_equal=ids_equal,
                           load=os.getloadavg()[0])
                rows.append(row)
    notes.append(f"a live stream: {n} envs ({len(games)} procedural games x groups of {group}) playing random "
                 f"admissible actions for {len(stream)} turns, one prompt per env per turn (H = 2 history); "
                 f"observations and histories are new every turn. Rust: one PromptBuilder for the whole stream "
                 f"(as the trainer uses it), encode_batch (ids, as the rollout takes them) per turn on `threads` threads; cold = its first turn "
                 f"(every piece new to its token-id cache), steady = the later turns. Python: str.format + "
                 f"apply_chat_template(add_generation_prompt=True, tokenize=True), one prompt after another, in "
                 f"`threads` processes (each a share of the turn's batch). Medians of {args.repeats} passes over "
                 f"the stream (a new builder each pass)")
    notes.append("cpu_*: process CPU time per prompt (1 thread, both sides in this process): comparable on a loaded "
                 "machine; texts/ids compared on the first and the last turn")
    cols = ["threads", "phase", "rust_prompts_per_s", "python_prompts_per_s", "speedup", "rust_cpu_us_per_prompt",
            "python_cpu_us_per_prompt", "cpu_speedup", "mean_prompt_tokens", "texts_equal", "ids_equal", "load"]

    def plot(ax, rows):
        labels = [f"{r['threads']}t {r['phase'].split(':')[0]}" for r in rows]
        x = range(len(rows))
        ax.bar([i - 0.2 for i in x], [r["rust_prompts_per_s"] for r in rows], width=0.4, label="Rust encode_batch")
        ax.bar([i + 0.2 for i in x], [r["python_prompts_per_s"] for r in rows], width=0.4,
               label="Python format + apply_chat_template")
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("prompts/s")
        ax.legend(fontsize=7)

    return emit("prompts", "Prompt build + chat template + tokenise on a live rollout stream: Rust vs Python", rows,
                cols, Path(args.out), args, notes, plot)


# ----------------------------------------------------------------------------------------------
# logprobs: chunked selective log-probs vs the naive full-logits reference
# ----------------------------------------------------------------------------------------------
def _logprob_inputs(tokens: int, hidden: int, vocab: int, device: str, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(tokens, hidden, generator=g).to(device)
    w = (torch.randn(vocab, hidden, generator=g) * hidden ** -0.5).to(device)
    t = torch.randint(0, vocab, (tokens,), generator=g).to(device)
    return h, w, t


def _logprob_fn(side: str, h, w, t, backward: bool):
    from pcsd.scoring import selective_logprobs, selective_logprobs_naive

    def fn():
        hh = h.detach().requires_grad_(backward)
        out = selective_logprobs(hh, w, t) if side == "chunked" else selective_logprobs_naive(hh, w, t)
        if backward:
            out.sum().backward()
        return out
    return fn


def logprobs_peak_worker(side: str, tokens: int, hidden: int, vocab: int, backward: bool) -> dict:
    """Run in a fresh process: peak RSS growth of one call over the inputs already allocated."""
    import resource

    import threading

    page = os.sysconf("SC_PAGE_SIZE")

    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * page

    h, w, t = _logprob_inputs(tokens, hidden, vocab, "cpu")
    fn = _logprob_fn(side, h, w, t, backward)
    base_max = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    base = rss()
    peak = [base]
    stop = threading.Event()

    def sample():  # ru_maxrss misses peaks below the import-time high-water mark: also poll RSS
        while not stop.is_set():
            peak[0] = max(peak[0], rss())
            stop.wait(0.0005)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    fn()
    stop.set()
    th.join()
    peak_max = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return dict(side=side, extra_bytes=max(peak[0] - base, peak_max - base_max))


def _peak_subprocess(side, tokens, hidden, vocab, backward) -> float:
    code = ("import json,sys; from pcsd.bench import logprobs_peak_worker as f; "
            f"print(json.dumps(f({side!r}, {tokens}, {hidden}, {vocab}, {backward})))")
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", str(os.cpu_count() or 1)))
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    if res.returncode != 0:
        raise RuntimeError(f"peak-memory subprocess for {side} failed: {res.stderr[-500:]}")
    return float(json.loads(res.stdout.strip().splitlines()[-1])["extra_bytes"])


def cmd_logprobs(args) -> dict:
    from pcsd.scoring import selective_logprobs, selective_logprobs_naive

    device = "cuda" if torch.cuda.is_available() else "cpu"
    sync = torch.cuda.synchronize if device == "cuda" else None
    rows, notes = [], []
    for n in args.tokens:
        h, w, t = _logprob_inputs(n, args.hidden, args.vocab, device)
        with torch.no_grad():
            err = float((selective_logprobs(h, w, t) - selective_logprobs_naive(h, w, t)).abs().max())
        for backward in (False, True):
            res = {}
            for side in ("chunked", "naive"):
                fn = _logprob_fn(side, h, w, t, backward)
                m = measure(fn, args.repeats, sync=sync)
                if device == "cuda":
                    torch.cuda.reset_peak_memory_stats()
                    base = torch.cuda.memory_allocated()
                    fn()
                    torch.cuda.synchronize()
                    extra = torch.cuda.max_memory_allocated() - base
                else:
                    extra = _peak_subprocess(side, n, args.hidden, args.vocab, backward)
                res[side] = (m, extra)
            (mc, xc), (mn, xn) = res["chunked"], res["naive"]
            rows.append(dict(tokens=n, hidden=args.hidden, vocab=args.vocab, pass_="fwd+bwd" if backward else "fwd",
                             chunked_ms=mc["median_s"] * 1e3, chunked_spread_rel=_rel_spread(mc),
                             naive_ms=mn["median_s"] * 1e3, naive_spread_rel=_rel_spread(mn),
                             time_chunked_vs_naive=mc["median_s"] / mn["median_s"],
                             chunked_us_per_token=mc["median_s"] / n * 1e6, naive_us_per_token=mn["median_s"] / n * 1e6,
                             chunked_peak_KB_per_token=xc / n / 1024, naive_peak_KB_per_token=xn / n / 1024,
                             memory_naive_vs_chunked=xn / xc if xc > 0 else float("nan"), max_abs_err=err))
    notes.append("peak = " + ("torch.cuda.max_memory_allocated over the inputs" if device == "cuda" else
                              "RSS growth over the allocated inputs (polled /proc/self/statm and ru_maxrss), in a fresh subprocess per side") +
                 f"; device {device}; chunk defaults token_chunk=1024, vocab_chunk=16384")
    cols = ["tokens", "hidden", "vocab", "pass_", "chunked_ms", "chunked_spread_rel", "naive_ms", "naive_spread_rel",
            "time_chunked_vs_naive", "chunked_us_per_token", "naive_us_per_token", "chunked_peak_KB_per_token",
            "naive_peak_KB_per_token", "memory_naive_vs_chunked", "max_abs_err"]

    def plot(ax, rows):
        labels = [f"{r['tokens']} {r['pass_']}" for r in rows]
        x = range(len(rows))
        ax.bar([i - 0.2 for i in x], [r["chunked_peak_KB_per_token"] for r in rows], 0.4, label="chunked")
        ax.bar([i + 0.2 for i in x], [r["naive_peak_KB_per_token"] for r in rows], 0.4, label="naive")
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_ylabel("peak KB / token")
        ax.legend()

    return emit("logprobs", "Selective log-probs: chunked vs naive (full vocabulary)", rows, cols, Path(args.out),
                args, notes, plot)


# ----------------------------------------------------------------------------------------------
# rollout: end-to-end multi-turn rollouts on the tiny model
# ----------------------------------------------------------------------------------------------
def _first_turn_prompts(builder, games: Sequence[str], group_size: int) -> list[list[int]]:
    """The turn-1 student prompts (token ids) of ``len(games) x group_size`` episodes."""
    from pcsd.envs.pool import EnvPool

    with EnvPool("alfworld", len(games) * group_size, group_size=group_size, games=list(games), max_steps=None,
                 num_threads=1) as pool:
        b = pool.reset()
        reqs = [dict(task=pool.task_of(e)[1], observation=o, admissible=list(a), history=[], step=0)
                for e, o, a in zip(b.env_id.tolist(), b.obs, b.admissible)]
    return builder.encode_batch(reqs)


def _check_model_path(args) -> None:
    """``--model-path`` selects the real-hardware run: a HF checkpoint, a CUDA GPU and vLLM."""
    import importlib.util

    if args.model_path is None:
        return
    if not (Path(args.model_path) / "config.json").is_file():
        raise SystemExit(f"error: --model-path: expected a Hugging Face checkpoint folder with a config.json, "
                         f"got {args.model_path!r}")
    if not torch.cuda.is_available():
        raise SystemExit("error: --model-path: the real-model rollout needs a CUDA GPU and torch.cuda.is_available() "
                         "is False here; without --model-path the benchmark runs the tiny model on the CPU")
    if importlib.util.find_spec("vllm") is None:
        raise SystemExit("error: --model-path: the real-model rollout needs vLLM (pip install 'pcsd[vllm]')")


def cmd_rollout(args) -> dict:
    import importlib.util

    from transformers import AutoModelForCausalLM

    from pcsd.prompts import PromptBuilder
    from pcsd.rollout.backends import make_backend
    from pcsd.rollout.loop import collect_rollouts
    from pcsd.scoring import score_packed
    from pcsd.testing import make_tiny_model

    _check_model_path(args)
    real = args.model_path is not None
    device = "cuda" if torch.cuda.is_available() else "cpu"  # vLLM takes the GPU when there is one: HF too
    rows, notes = [], []
    with tempfile.TemporaryDirectory(prefix="pcsd-bench-rollout-") as tmp:
        model_dir = Path(args.model_path) if real else make_tiny_model(Path(tmp) / "model")
        games = make_games(Path(tmp) / "games", args.games)
        builder = PromptBuilder("alfworld", history_length=2, max_prompt_tokens=2048, tokenizer_dir=model_dir)
        eos = builder.tokenizer.encode("<|im_end|>")[0]
        dtype = torch.bfloat16 if real else torch.float32
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
        sync = torch.cuda.synchronize if device == "cuda" else None
        backends = [("hf", lambda: make_backend("hf", model=model, pad_token_id=eos))]
        if args.no_vllm:
            notes.append("vllm backend skipped: --no-vllm")
        elif importlib.util.find_spec("vllm") is None:
            notes.append("vllm backend skipped: vllm is not importable in this environment")
        elif real:  # GPU: the engine takes its share of the device, the trainer's copy sits beside it
            backends.append(("vllm", lambda: make_backend("vllm", model_path=str(model_dir), dtype="bfloat16",
                                                          max_model_len=4096, gpu_memory_utilization=0.4)))
        else:
            backends.append(("vllm", lambda: make_backend("vllm", model_path=str(model_dir), dtype="float32",
                                                          max_model_len=2048, kv_cache_bytes=256 << 20)))
        first = _first_turn_prompts(builder, games, args.group_size)
        for name, mk in backends:
            try:
                backend = mk()
            except Exception as exc:
                notes.append(f"{name} backend skipped: {type(exc).__name__}: {str(exc)[:200]}")
                continue
            try:
                # generation alone: the turn-1 prompts of every episode, one batch
                gen = []

                def gen_once():
                    gen.append(backend.generate(first, n=1, max_tokens=args.max_tokens, seed=len(gen)))

                mg = measure(gen_once, args.repeats, sync=sync)
                ntok = round(statistics.median(sum(len(s[0].token_ids) for s in out) for out in gen[1:]))
                rows.append(dict(backend=name, phase="generate only", episodes=len(first), gen_tokens=ntok,
                                 seconds=mg["median_s"], spread_rel=_rel_spread(mg),
                                 gen_tokens_per_s=ntok / mg["median_s"]))

                results = []

                def once():
                    b = collect_rollouts(backend, builder, games=games, group_size=args.group_size,
                                         max_steps=args.max_steps, max_response_tokens=args.max_tokens,
                                         seed=len(results), stop_token_ids=[eos])
                    t0 = time.perf_counter()
                    with torch.no_grad():  # what the trainer does next: log-probs of the sampled tokens
                        score_packed(model, b.prompt_ids, b.response_ids)  # student prompts
                        score_packed(model, b.teacher_prompt_ids, b.response_ids)  # teacher prompts
                    if sync:
                        sync()
                    results.append((b, time.perf_counter() - t0))

                m = measure(once, args.repeats, sync=sync)
            finally:
                backend.close()
            timed = results[1:]  # the first is the warm-up
            k = min(range(len(timed)), key=lambda i: abs(timed[i][0].timings.total + timed[i][1] - m["median_s"]))
            b, scoring_s = timed[k]
            tm = b.timings
            eps = b.num_trajectories
            rows.append(dict(backend=name, phase="rollout", episodes=eps, turns=b.num_rows, gen_tokens=b.num_tokens(),
                             seconds=m["median_s"], spread_rel=_rel_spread(m), episodes_per_s=eps / tm.total,
                             turns_per_s=b.num_rows / tm.total, gen_tokens_per_s=b.num_tokens() / tm.total,
                             generation_s=tm.generation, env_s=tm.env, prompts_s=tm.prompts, parsing_s=tm.parsing,
                             scoring_s=scoring_s, rollout_s=tm.total, outside_model_share=tm.outside_model_share(),
                             win_rate=float(b.won.float().mean())))
        del model
    gen_rows = {r["backend"]: r for r in rows if r["phase"] == "generate only"}
    roll_rows = {r["backend"]: r for r in rows if r["phase"] == "rollout"}
    if "hf" in gen_rows and "vllm" in gen_rows:
        gen_rows["vllm"]["vllm_vs_hf"] = gen_rows["vllm"]["gen_tokens_per_s"] / gen_rows["hf"]["gen_tokens_per_s"]
    if "hf" in roll_rows and "vllm" in roll_rows:
        roll_rows["vllm"]["vllm_vs_hf"] = roll_rows["vllm"]["episodes_per_s"] / roll_rows["hf"]["episodes_per_s"]
    what = (f"model {model_dir} (bfloat16, CUDA)" if real else f"tiny Qwen2 model (random weights, float32, {device})")
    notes.append(f"{args.games} procedural games x group {args.group_size}, max_steps={args.max_steps}, "
                 f"max_response_tokens={args.max_tokens}, {what}, torch threads {torch.get_num_threads()}")
    notes.append("generate only: one batch of the turn-1 prompts of every episode (no stop token); vllm_vs_hf = "
                 "generated tokens/s (generate only) or episodes/s (rollout) of vLLM over HF")
    notes.append("rollout: rates and time split (generation, env, prompt assembly, parsing) of the repeat closest to "
                 "the median; rates over rollout_s; scoring_s = log-probs of the sampled tokens on the student and "
                 "the teacher prompts (pcsd.scoring.score_packed, no grad), timed after the rollout; "
                 "outside_model_share = (env + prompts + parsing) / rollout_s (goal <= 5 %)")
    cols = ["backend", "phase", "episodes", "turns", "gen_tokens", "seconds", "spread_rel", "episodes_per_s",
            "turns_per_s", "gen_tokens_per_s", "vllm_vs_hf", "generation_s", "env_s", "prompts_s", "parsing_s",
            "scoring_s", "rollout_s", "outside_model_share", "win_rate"]

    def plot(ax, rows):
        rs = [r for r in rows if r["phase"] == "rollout"]
        bottom = [0.0] * len(rs)
        for part in ("generation_s", "env_s", "prompts_s", "parsing_s", "scoring_s"):
            vals = [r[part] for r in rs]
            ax.bar([r["backend"] for r in rs], vals, bottom=bottom, label=part[:-2])
            bottom = [a + b for a, b in zip(bottom, vals)]
        ax.set_ylabel("seconds per rollout batch (+ scoring)")
        ax.legend(fontsize=7)

    title = "End-to-end multi-turn rollout: HF vs vLLM backend" + (" (real model, CUDA)" if real else " (tiny model)")
    return emit("rollout", title, rows, cols, Path(args.out), args, notes, plot)



# ----------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------
def _pos_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {s!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {s!r}")
    return v


# Sizes: (full, --quick, --tiny). --tiny is for the tests (seconds).
DEFAULTS: dict[str, dict[str, tuple]] = {
    "op": dict(tokens=([1_000_000, 10_000_000], [1_000_000], [20_000]), repeats=(5, 5, 2)),
    # env: --steps / --real-steps / --mp-steps default to whole episode cycles (stream_len + 1 steps
    # per env, the reset included), so every timed repeat holds the same work
    "env": dict(sizes=([128, 1024, 4096], [128, 1024], [16]), repeats=(5, 3, 2), games=(64, 16, 2),
                real_games=(4, 2, 1), stream_len=(10, 10, 3), mp_envs=(16, 4, 2),
                webshop_products=(100_000, 20_000, 2_000)),
    "prompts": dict(envs=(256, 128, 8), turns=(8, 6, 3), repeats=(3, 2, 1)),
    "logprobs": dict(tokens=([512, 2048], [256, 1024], [16]), hidden=(64, 64, 32), repeats=(5, 3, 2)),
    "rollout": dict(games=(4, 2, 1), group_size=(4, 2, 2), max_steps=(8, 4, 2), max_tokens=(48, 24, 6),
                    repeats=(3, 2, 1)),
}


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="bench-results", help="output folder for JSON and PNG (default bench-results/)")
    p.add_argument("--quick", action="store_true", help="small sizes (the whole `all` in < 10 min on 2 cores)")
    p.add_argument("--tiny", action="store_true", help="tiny sizes for smoke tests (seconds)")
    p.add_argument("--repeats", type=_pos_int, default=None, help="timed repeats after one warm-up")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m pcsd.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="{op,env,prompts,logprobs,rollout,all}")
    p = sub.add_parser("op", help="PCSD weights op: native vs eager vs torch.compile reference vs copy")
    _add_common(p)
    p.add_argument("--tokens", type=_pos_int, nargs="+")
    p.add_argument("--threads", type=_pos_int, nargs="+", help="torch threads (default 1 and all)")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile column")
    p.set_defaults(func=cmd_op)
    p = sub.add_parser("env", help="native env pool vs the real alfworld engine (alone and in a process pool)")
    _add_common(p)
    p.add_argument("--sizes", type=_pos_int, nargs="+", help="pool sizes (envs)")
    p.add_argument("--threads", type=_pos_int, nargs="+",
                   help="native pool threads and mp-pool worker processes (default 1 .. all cores)")
    p.add_argument("--steps", type=_pos_int, help="native steps per env per timed repeat (default: one episode cycle)")
    p.add_argument("--games", type=_pos_int, help="distinct procedural games")
    p.add_argument("--group-size", type=_pos_int, default=8, help="envs per game (GRPO group)")
    p.add_argument("--stream-len", type=_pos_int, help="commands per episode before the reset")
    p.add_argument("--real-steps", type=_pos_int, help="single real engine: steps per timed repeat (default: one "
                   "episode cycle per game)")
    p.add_argument("--real-games", type=_pos_int, help="games the real engine plays")
    p.add_argument("--mp-envs", type=_pos_int, help="real alfworld envs in the multiprocessing pool")
    p.add_argument("--mp-steps", type=_pos_int, help="mp-pool steps per env per timed repeat (default: one episode "
                   "cycle)")
    p.add_argument("--no-real", action="store_true", help="skip the real alfworld engine (alone and mp pool)")
    p.add_argument("--webshop", help="WebShop data folder (default $WEBSHOP_DATA): adds the WebShop rows")
    p.add_argument("--webshop-products", type=_pos_int, help="products in the synthetic WebShop scale row")
    p.set_defaults(func=cmd_env)
    p = sub.add_parser("prompts", help="prompt build + chat template + tokenise on a live rollout stream: Rust vs "
                       "Python")
    _add_common(p)
    p.add_argument("--envs", type=_pos_int, help="envs in the stream (one prompt per env per turn)")
    p.add_argument("--group-size", type=_pos_int, default=8, help="envs per procedural game (GRPO group)")
    p.add_argument("--turns", type=_pos_int, help="turns of the stream (the first is the cold one)")
    p.add_argument("--threads", type=_pos_int, nargs="+",
                   help="Rust encode_batch threads and Python processes (default 1 and all cores)")
    p.set_defaults(func=cmd_prompts)
    p = sub.add_parser("logprobs", help="chunked vs naive selective log-probs, full vocabulary")
    _add_common(p)
    p.add_argument("--tokens", type=_pos_int, nargs="+")
    p.add_argument("--hidden", type=_pos_int)
    p.add_argument("--vocab", type=_pos_int, default=FULL_VOCAB)
    p.set_defaults(func=cmd_logprobs)
    p = sub.add_parser("rollout", help="end-to-end multi-turn rollout on the tiny model (hf, vllm)")
    _add_common(p)
    p.add_argument("--games", type=_pos_int)
    p.add_argument("--group-size", type=_pos_int)
    p.add_argument("--max-steps", type=_pos_int)
    p.add_argument("--max-tokens", type=_pos_int)
    p.add_argument("--no-vllm", action="store_true", help="skip the vLLM backend")
    p.add_argument("--model-path", help="a HF checkpoint to run instead of the tiny model (needs a CUDA GPU and "
                   "vLLM): its vLLM generation tokens/s and the rollout split on real hardware")
    p.set_defaults(func=cmd_rollout)
    p = sub.add_parser("all", help="every benchmark in turn")
    _add_common(p)
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--no-real", action="store_true")
    p.add_argument("--no-vllm", action="store_true")
    p.add_argument("--model-path", help="passed to rollout (CUDA GPU only)")
    p.set_defaults(func=None)
    return ap


def _fill_defaults(name: str, args: argparse.Namespace) -> argparse.Namespace:
    level = 2 if args.tiny else (1 if args.quick else 0)
    for key, vals in DEFAULTS[name].items():
        if getattr(args, key, None) is None:
            setattr(args, key, vals[level])
    return args


def main(argv: Sequence[str] | None = None) -> dict:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.cmd != "all":
        return {args.cmd: args.func(_fill_defaults(args.cmd, args))}
    _check_model_path(args)  # refuse before the first benchmark, not after the fourth
    results = {}
    t0 = time.perf_counter()
    for name in SUBCOMMANDS:
        sub_argv = [name, "--out", args.out] + (["--quick"] if args.quick else []) + (["--tiny"] if args.tiny else [])
        if args.repeats:
            sub_argv += ["--repeats", str(args.repeats)]
        if name == "op" and args.no_compile:
            sub_argv.append("--no-compile")
        if name == "env" and args.no_real:
            sub_argv.append("--no-real")
        if name == "rollout" and args.no_vllm:
            sub_argv.append("--no-vllm")
        if name == "rollout" and args.model_path:
            sub_argv += ["--model-path", args.model_path]
        sa = ap.parse_args(sub_argv)
        t1 = time.perf_counter()
        results[name] = sa.func(_fill_defaults(name, sa))
        print(f"[{name}: {time.perf_counter() - t1:.1f} s]", flush=True)
    print(f"[all: {time.perf_counter() - t0:.1f} s]")
    return results


if __name__ == "__main__":
    main()
