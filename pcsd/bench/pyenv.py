"""``python -m pcsd.bench env --python``: the pool of Python text environments
(:class:`pcsd.envs.pypool.PythonEnvPool`) against the same envs stepped in a plain loop.

Two figures (issue 23):

* **overhead per env step** with a trivial env (:class:`pcsd.envs.toy.DirectionEnv`, a few µs a
  step): (pool time - plain-loop time) / env steps, for several numbers of envs per worker (one
  message per worker per call carries all its envs, so the pipes' cost is shared);
* **scaling from 1 to 2 workers** with an env that computes ~``--busy-ms`` per step (pure-Python
  integer work, calibrated here): the pool's steps/s with 2 worker processes over 1.

Both sides step the same envs with the same actions; the plain loop runs in this process. The
machine's load (1-minute average) is printed beside each row: scaling needs idle cores. Beside
the wall times, CPU time per env step (this thread's, plus the workers' from
``/proc/<pid>/schedstat``): on a loaded machine wall time measures the queue for the cores, CPU
time what the pool itself costs (``cpu_overhead_us_per_step`` = pool CPU - plain-loop CPU).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from pcsd.bench.common import amdahl, emit, measure, pos_int, rel_spread
from pcsd.envs.protocol import EnvFactory


def _factory(busy_iters: int = 0) -> EnvFactory:
    # episodes far longer than a measurement: every timed step is a step (no resets)
    return EnvFactory("pcsd.envs.toy:DirectionEnv", kwargs={"episode_len": 1_000_000, "busy_iters": busy_iters})


def calibrate_busy(ms: float) -> int:
    """Iterations of :func:`pcsd.envs.toy.busy` that take about ``ms`` milliseconds here: the
    fastest of many short runs (~0.2 ms each, which the scheduler rarely interrupts), scaled."""
    from pcsd.envs.toy import busy

    n = 1000
    times = []
    for _ in range(31):
        t0 = time.perf_counter()
        busy(n)
        times.append(time.perf_counter() - t0)
    return max(1, int(n * ms / 1e3 / min(times)))


def _proc_cpu_ns(pids: list[int]) -> int:
    """CPU time (ns) the processes ``pids`` used so far (Linux ``/proc/<pid>/schedstat``; 0 elsewhere)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


def _timed(once, repeats: int, pids: list[int]) -> dict:
    cpu = [0, 0]  # this thread, the workers

    def counted() -> None:
        c0, w0 = time.thread_time_ns(), _proc_cpu_ns(pids)
        once()
        cpu[0] += time.thread_time_ns() - c0
        cpu[1] += _proc_cpu_ns(pids) - w0

    once()  # warm-up, not counted
    m = measure(counted, repeats, warmup=0)
    m["serial_cpu_s"], m["worker_cpu_s"] = cpu[0] / 1e9 / repeats, cpu[1] / 1e9 / repeats
    m["cpu_s"] = m["serial_cpu_s"] + m["worker_cpu_s"]
    return m


def _plain(factory: EnvFactory, num_envs: int, steps: int, repeats: int) -> dict:
    envs = [factory() for _ in range(num_envs)]
    for k, env in enumerate(envs):
        env.reset(seed=k)

    def once() -> None:
        for _ in range(steps):
            for env in envs:
                env.step("left")

    return _timed(once, repeats, [])


def _pool(factory: EnvFactory, num_envs: int, workers: int, steps: int, repeats: int, spin: bool = True) -> dict:
    """``spin=False``: the caller sleeps on the workers' sockets at once (``spin_s=0``), the pool
    as it was before it polled them (the alternative of the overhead rows)."""
    from pcsd.envs import pypool

    actions = ["left"] * num_envs
    spin_s = pypool.SPIN_S if spin else 0.0
    with (
        pypool.EnvWorkers(factory, min(workers, num_envs), spin_s=spin_s) as w,
        pypool.PythonEnvPool(w, num_envs, max_steps=None) as pool,
    ):
        pool.reset()

        def once() -> None:
            for _ in range(steps):
                pool.step(actions)

        return _timed(once, repeats, w.pids())


def run(args) -> dict:
    rows = []
    repeats = args.repeats
    trivial = _factory()
    for n in args.python_envs:
        for w in args.python_workers:
            if w > n:
                continue
            steps = max(1, args.python_steps // n)
            plain = _plain(trivial, n, steps, repeats)
            pool = _pool(trivial, n, w, steps, repeats)
            asleep = _pool(trivial, n, w, steps, repeats, spin=False) if w == 1 else None
            total = n * steps
            rows.append(
                dict(
                    measure="overhead, trivial env",
                    envs=n,
                    workers=w,
                    envs_per_worker=n / w,
                    plain_us_per_step=plain["median_s"] / total * 1e6,
                    pool_us_per_step=pool["median_s"] / total * 1e6,
                    overhead_us_per_step=(pool["median_s"] - plain["median_s"]) / total * 1e6,
                    cpu_overhead_us_per_step=(pool["cpu_s"] - plain["cpu_s"]) / total * 1e6,
                    overhead_asleep_us_per_step=(asleep["median_s"] - plain["median_s"]) / total * 1e6
                    if asleep
                    else None,
                    pool_spread_rel=rel_spread(pool),
                    load=os.getloadavg()[0],
                )
            )
    iters = calibrate_busy(args.busy_ms)
    busy_env = _factory(iters)
    n = args.scaling_envs
    steps = args.scaling_steps
    plain = _plain(busy_env, n, steps, repeats)
    rates = {}
    for w in (1, 2):
        m = _pool(busy_env, n, w, steps, repeats)
        rates[w] = n * steps / m["median_s"]
        share = m["serial_cpu_s"] / m["cpu_s"] if m["cpu_s"] > 0 else float("nan")
        rows.append(
            dict(
                measure=f"scaling, ~{args.busy_ms:g} ms/step env",
                envs=n,
                workers=w,
                envs_per_worker=n / w,
                plain_us_per_step=plain["median_s"] / (n * steps) * 1e6,
                pool_us_per_step=1e6 / rates[w],
                steps_per_s=rates[w],
                pool_spread_rel=rel_spread(m),
                speedup_vs_1_worker=rates[w] / rates[1],
                serial_share=share,
                amdahl_bound_2=amdahl(share, 2) if w == 1 else None,
                load=os.getloadavg()[0],
            )
        )
    notes = [
        f"overhead = (pool - plain loop) per env step, DirectionEnv (trivial: {rows[0]['plain_us_per_step']:.1f} "
        "us/step in the plain loop), the pool's workers in their own processes, one message per worker per "
        "call; goal <= 50 us; overhead_asleep = the same with one worker when the caller sleeps on the worker's "
        "socket at once (EnvWorkers spin_s=0) instead of polling it for pcsd.envs.pypool.SPIN_S first (the pool "
        "before polling)",
        f"scaling: DirectionEnv with {iters:,} busy iterations per step (calibrated to "
        f"~{args.busy_ms:g} ms here), {n} envs; speedup_vs_1_worker of 2 workers, goal >= 1.7 (needs 2 idle "
        "cores: see load, the 1-minute load average); serial_share = the calling thread's CPU / all CPU of the "
        "call (parent + workers), amdahl_bound_2 = 1 / (s + (1 - s) / 2), what 2 workers allow on 2 idle cores",
    ]
    cols = [
        "measure",
        "envs",
        "workers",
        "envs_per_worker",
        "plain_us_per_step",
        "pool_us_per_step",
        "overhead_us_per_step",
        "cpu_overhead_us_per_step",
        "overhead_asleep_us_per_step",
        "steps_per_s",
        "speedup_vs_1_worker",
        "serial_share",
        "amdahl_bound_2",
        "pool_spread_rel",
        "load",
    ]
    return emit(
        "env_python",
        "Python text envs: the worker-process pool vs the same envs in a plain loop",
        rows,
        cols,
        Path(args.out),
        args,
        notes,
    )


def add_arguments(p) -> None:
    p.add_argument(
        "--python",
        action="store_true",
        help="benchmark the pool of Python text envs instead (overhead per step, 1 -> 2 workers)",
    )
    p.add_argument("--python-envs", type=pos_int, nargs="+", help="--python: pool sizes of the overhead rows")
    p.add_argument("--python-workers", type=pos_int, nargs="+", help="--python: worker processes of the overhead rows")
    p.add_argument("--python-steps", type=pos_int, help="--python: env steps per timed repeat of an overhead row")
    p.add_argument("--busy-ms", type=float, default=1.0, help="--python: CPU time per step of the scaling env (ms)")
    p.add_argument("--scaling-envs", type=pos_int, help="--python: envs in the scaling rows")
    p.add_argument("--scaling-steps", type=pos_int, help="--python: steps per env per timed repeat (scaling)")


#: sizes: (full, --quick, --tiny)
DEFAULTS: dict[str, tuple] = dict(
    python_envs=([1, 8, 64, 256], [8, 64], [4]),
    python_workers=([1, 2], [1, 2], [1]),
    python_steps=(20_000, 5_000, 200),
    scaling_envs=(16, 16, 4),
    scaling_steps=(50, 20, 2),
)
