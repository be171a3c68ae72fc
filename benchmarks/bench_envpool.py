"""Throughput of pcsd's batched env pool (env steps per second).

For each engine, pool size and thread count it measures the synchronous mode (``step`` on all
envs) and the asynchronous mode (envpool style: ``recv`` the first half of the envs to finish,
``send`` them their next action), and prints one table with the ratios measured in the same run:
2 threads vs 1, async vs sync. Beside steps/s it reports where the CPU time went (``serial``: the
calling thread — Python, argument and result conversion with the GIL held, dispatch — which never
runs in parallel; the rest: the pool's worker threads) and the speed-up of 2 threads over 1 that
this split allows (Amdahl). CPU time stays meaningful on a machine shared with other jobs, where
the measured ratio does not: compare the ratio with the bound, and mind the load average printed.

Engines (``--engines``):
  dummy       the native deterministic test game; ``--busy-iters`` sets its CPU work per step
              (a list: 0 measures the pool's own overhead).
  alfworld    the native ALFWorld engine on ALFWORLD_DATA games, 8 envs per game; each game
              plays a recorded stream of admissible commands (go to / examine / look /
              inventory) for STREAM_LEN steps, then the auto-reset step.
  reference   the original Python alfworld/TextWorld engine stepped one env after another
              (the baseline the native engine is compared with; needs alfworld and ALFWORLD_DATA).

``--prompts`` instead measures prompt building (ALFWorld student prompt + chat template +
token ids) on a live rollout stream, Rust ``encode_batch`` vs Python ``str.format`` +
``apply_chat_template(tokenize=True)``: the first turn (cold token-id cache) and the later turns
(steady state) apart, 1 thread against 1 process and N threads against N processes; it runs
``python -m pcsd.bench prompts`` (see there).

Usage::

    python benchmarks/bench_envpool.py                          # 128/1024/4096 envs, 1 and 2 threads
    python benchmarks/bench_envpool.py --sizes 128 --threads 1 2 4 --seconds 2
    python benchmarks/bench_envpool.py --prompts --envs 256 --turns 8
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import time
from dataclasses import dataclass
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pcsd.bench.common import amdahl, pool_worker_cpu_ns  # noqa: E402
from pcsd.envs.pool import EnvPool  # noqa: E402

ACTION = "go north"


@dataclass
class Row:
    engine: str
    num_envs: int
    threads: int
    mode: str
    steps_per_s: float
    serial_ns: float  # calling-thread CPU per env step
    worker_ns: float  # pool worker CPU per env step

    @property
    def serial_share(self) -> float:
        return self.serial_ns / (self.serial_ns + self.worker_ns)


def _timed(run_once: Callable[[], int], seconds: float, min_rounds: int = 3) -> tuple[float, float, float]:
    """Env steps per second of `run_once` (which returns the env steps it made), repeated for at
    least `seconds` and `min_rounds` rounds, after one warm-up round; and the CPU ns per env step of
    the calling thread and of the pool's workers (nan where /proc is not available)."""
    run_once()
    steps, rounds = 0, 0
    w0 = pool_worker_cpu_ns()
    m0, t0 = time.thread_time_ns(), time.perf_counter()
    while rounds < min_rounds or time.perf_counter() - t0 < seconds:
        steps += run_once()
        rounds += 1
    wall, main = time.perf_counter() - t0, time.thread_time_ns() - m0
    w1 = pool_worker_cpu_ns()
    worker = (w1 - w0) / steps if w0 is not None and w1 is not None else float("nan")
    return steps / wall, main / steps, worker


@dataclass
class Script:
    """What the envs are told: at its k-th step env e gets ``per_step[k % len(per_step)][e]``."""

    per_step: list[list[str]]


def bench_sync(pool: EnvPool, script: Script, seconds: float) -> tuple[float, float, float]:
    pool.reset()
    k = [0]

    def once() -> int:
        pool.step(script.per_step[k[0] % len(script.per_step)])
        k[0] += 1
        return pool.num_envs

    return _timed(once, seconds)


def bench_async(pool: EnvPool, script: Script, seconds: float) -> tuple[float, float, float]:
    n = pool.num_envs
    batch = max(1, n // 2)
    pool.send_reset(range(n))
    k, m = [0] * n, len(script.per_step)

    def once() -> int:
        # One round: as many recv/send cycles as it takes to step every env once on average.
        done = 0
        while done < n:
            ids = pool.recv(batch).env_id.tolist()
            acts = []
            for e in ids:
                acts.append(script.per_step[k[e] % m][e])
                k[e] += 1
            pool.send(acts, ids)
            done += len(ids)
        return done

    rate = _timed(once, seconds)
    pool.recv()  # drain what is still outstanding
    return rate


def dummy_pool(busy_iters: int) -> Callable[[int, int], tuple[EnvPool, Script]]:
    def make(num_envs: int, threads: int) -> tuple[EnvPool, Script]:
        # auto_reset keeps every env playing for as long as the benchmark runs.
        pool = EnvPool(
            "dummy",
            num_envs,
            num_threads=threads,
            auto_reset=True,
            max_steps=None,
            episode_len=20,
            busy_iters=busy_iters,
        )
        return pool, Script([[ACTION] * num_envs])

    return make


def alfworld_games(limit: int) -> list[str]:
    root = os.environ.get("ALFWORLD_DATA")
    if not root:
        raise RuntimeError("ALFWORLD_DATA is not set")
    games = sorted(glob.glob(os.path.join(root, "json_2.1.1", "train", "*", "*", "game.tw-pddl")))
    if not games:
        raise RuntimeError(f"no games under {root}/json_2.1.1/train")
    return games[:limit]


ALFWORLD_GROUP = 8  # GRPO-style: 8 envs play each game
STREAM_LEN = 10  # commands per episode, then the auto-reset step


def alfworld_pool(num_envs: int, threads: int) -> tuple[EnvPool, Script]:
    from pcsd.bench.env import command_streams

    group = min(ALFWORLD_GROUP, num_envs)
    num_groups = num_envs // group
    games = alfworld_games(num_groups)
    streams = command_streams(games, STREAM_LEN)
    gi = [g % len(games) for g in range(num_groups)]
    pool = EnvPool(
        "alfworld",
        num_groups * group,
        group_size=group,
        games=[games[i] for i in gi],
        num_threads=threads,
        auto_reset=True,
        max_steps=STREAM_LEN,
    )
    # step j of an episode: command j of the group's stream; step STREAM_LEN resets (action ignored)
    per_step = [
        [streams[gi[e // group]][min(j, STREAM_LEN - 1)] for e in range(pool.num_envs)] for j in range(STREAM_LEN + 1)
    ]
    return pool, Script(per_step)


def bench_reference(num_envs: int, seconds: float) -> float:
    """The original Python engine, one env after another (no pool)."""
    import textworld  # noqa: F401  (fails clearly when alfworld/textworld is missing)
    import textworld.gym
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos

    games = alfworld_games(num_envs)
    infos = textworld.EnvInfos(admissible_commands=True, won=True)
    env_id = textworld.gym.register_games(
        games,
        infos,
        batch_size=1,
        asynchronous=False,
        max_episode_steps=10_000,
        wrappers=[AlfredDemangler, AlfredInfos],
    )
    env = textworld.gym.make(env_id)
    env.reset()

    def once() -> int:
        _, _, dones, _ = env.step([ACTION])
        if dones[0]:
            env.reset()
        return 1

    return _timed(once, seconds)[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", nargs="+", default=["dummy"], choices=["dummy", "alfworld", "reference"])
    ap.add_argument("--sizes", nargs="+", type=int, default=[128, 1024, 4096])
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--busy-iters", nargs="+", type=int, default=[0, 5000], help="dummy env CPU work per step")
    ap.add_argument("--seconds", type=float, default=1.0, help="time per measurement")
    ap.add_argument("--prompts", action="store_true", help="measure prompt building instead of env steps")
    ap.add_argument("--envs", type=int, default=256, help="--prompts: envs in the stream (one prompt each per turn)")
    ap.add_argument("--turns", type=int, default=8, help="--prompts: turns of the stream (the first is cold)")
    ap.add_argument("--repeats", type=int, default=3, help="--prompts: passes over the stream")
    ap.add_argument("--out", default="bench-results", help="--prompts: folder for prompts.json / .png")
    args = ap.parse_args()
    if args.prompts:
        from pcsd.bench.cli import main as bench_main

        bench_main(
            [
                "prompts",
                "--envs",
                str(args.envs),
                "--turns",
                str(args.turns),
                "--repeats",
                str(args.repeats),
                "--threads",
                *map(str, args.threads),
                "--out",
                args.out,
            ]
        )
        return

    makers: list[tuple[str, Callable[[int, int], tuple[EnvPool, Script]]]] = []
    for e in args.engines:
        if e == "dummy":
            makers += [(f"dummy(busy={b})", dummy_pool(b)) for b in args.busy_iters]
        elif e == "alfworld":
            makers.append(("alfworld-native", alfworld_pool))

    rows: list[Row] = []
    print(f"cpus={os.cpu_count()}  seconds/measurement={args.seconds}", flush=True)
    for name, make in makers:
        for n in args.sizes:
            for t in args.threads:
                try:
                    pool, script = make(n, t)
                except (ValueError, RuntimeError) as exc:
                    print(f"skip {name} n={n} t={t}: {exc}", flush=True)
                    continue
                for mode, fn in (("sync", bench_sync), ("async", bench_async)):
                    row = Row(name, n, t, mode, *fn(pool, script, args.seconds))
                    rows.append(row)
                    print(
                        f"  {name:18s} envs={n:5d} threads={t} {mode:5s} {row.steps_per_s:12,.0f} steps/s  "
                        f"CPU per step: serial {row.serial_ns:7,.0f} ns, workers {row.worker_ns:7,.0f} ns  "
                        f"load {os.getloadavg()[0]:.1f}",
                        flush=True,
                    )
                pool.close()
    if "reference" in args.engines:
        for n in args.sizes[:1]:
            try:
                rate = bench_reference(n, args.seconds)
                rows.append(Row("alfworld-reference", n, 1, "seq", rate, float("nan"), float("nan")))
            except Exception as exc:  # missing package / data: report and go on
                print(f"skip reference: {type(exc).__name__}: {exc}", flush=True)

    by = {(r.engine, r.num_envs, r.threads, r.mode): r for r in rows}
    t_lo, t_hi = min(args.threads), max(args.threads)
    print(
        f"\nload average {os.getloadavg()[0]:.1f} (cpus={os.cpu_count()}); serial = share of the CPU time on the "
        f"calling thread; bound = Amdahl's limit of {t_hi}t/{t_lo}t from the {t_lo}-thread serial share"
    )
    hdr = f"{'engine':18s} {'envs':>5s} {'thr':>3s} {'sync steps/s':>14s} {'async steps/s':>14s} {'async/sync':>10s}"
    hdr += f" {'serial sync':>11s} {'serial async':>12s} {f'sync {t_hi}t/{t_lo}t':>12s} {f'async {t_hi}t/{t_lo}t':>13s}"
    hdr += f" {'bound sync':>10s} {'bound async':>11s}"
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        if r.mode != "sync":
            continue
        a = by.get((r.engine, r.num_envs, r.threads, "async"))
        if a is None:
            continue
        line = (
            f"{r.engine:18s} {r.num_envs:5d} {r.threads:3d} {r.steps_per_s:14,.0f} {a.steps_per_s:14,.0f} "
            f"{a.steps_per_s / r.steps_per_s:10.2f} {r.serial_share:11.1%} {a.serial_share:12.1%}"
        )
        s1, a1 = by.get((r.engine, r.num_envs, t_lo, "sync")), by.get((r.engine, r.num_envs, t_lo, "async"))
        if r.threads == t_hi and t_hi != t_lo and s1 and a1:
            k = t_hi // t_lo
            line += (
                f" {r.steps_per_s / s1.steps_per_s:12.2f} {a.steps_per_s / a1.steps_per_s:13.2f}"
                f" {amdahl(s1.serial_share, k):10.2f} {amdahl(a1.serial_share, k):11.2f}"
            )
        print(line)
    for r in rows:
        if r.mode == "seq":
            print(f"{r.engine:18s} {'1':>5s} {'1':>3s} {r.steps_per_s:14,.0f}   (sequential Python engine)")


if __name__ == "__main__":
    main()
