"""Throughput of pcsd's batched env pool (env steps per second).

For each engine, pool size and thread count it measures the synchronous mode (``step`` on all
envs) and the asynchronous mode (envpool style: ``recv`` the first half of the envs to finish,
``send`` them their next action), and prints one table with the ratios measured in the same run:
2 threads vs 1, async vs sync.

Engines (``--engines``):
  dummy       the native deterministic test game; ``--busy-iters`` sets its CPU work per step
              (a list: 0 measures the pool's own overhead).
  alfworld    the native ALFWorld engine on ALFWORLD_DATA games (once merged; skipped until the
              pool is built with it).
  reference   the original Python alfworld/TextWorld engine stepped one env after another
              (the baseline the native engine is compared with; needs alfworld and ALFWORLD_DATA).

``--prompts`` instead measures prompt building (ALFWorld student prompt + chat template +
token ids) on real observations of procedural games: the Rust ``build_batch`` with a cold piece
cache (a new builder per batch: every line of text is new to it), with a warm one (the batch seen
before, as in ``python -m pcsd.bench prompts``), and Python ``str.format`` +
``apply_chat_template(tokenize=True)``; ids are checked equal first.

Usage::

    python benchmarks/bench_envpool.py                          # 128/1024/4096 envs, 1 and 2 threads
    python benchmarks/bench_envpool.py --sizes 128 --threads 1 2 4 --seconds 2
    python benchmarks/bench_envpool.py --prompts --batch 256
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

from pcsd.envs.pool import EnvPool  # noqa: E402

ACTION = "go north"


@dataclass
class Row:
    engine: str
    num_envs: int
    threads: int
    mode: str
    steps_per_s: float


def _timed(run_once: Callable[[], int], seconds: float, min_rounds: int = 3) -> float:
    """Env steps per second of `run_once` (which returns the env steps it made), repeated for at
    least `seconds` and `min_rounds` rounds, after one warm-up round."""
    run_once()
    steps, rounds = 0, 0
    t0 = time.perf_counter()
    while rounds < min_rounds or time.perf_counter() - t0 < seconds:
        steps += run_once()
        rounds += 1
    return steps / (time.perf_counter() - t0)


def bench_sync(pool: EnvPool, seconds: float) -> float:
    actions = [ACTION] * pool.num_envs
    pool.reset()

    def once() -> int:
        pool.step(actions)
        return pool.num_envs

    return _timed(once, seconds)


def bench_async(pool: EnvPool, seconds: float) -> float:
    n = pool.num_envs
    batch = max(1, n // 2)
    pool.send_reset(range(n))

    def once() -> int:
        # One round: as many recv/send cycles as it takes to step every env once on average.
        done = 0
        while done < n:
            b = pool.recv(batch)
            pool.send([ACTION] * len(b), b.env_id)
            done += len(b)
        return done

    rate = _timed(once, seconds)
    pool.recv()  # drain what is still outstanding
    return rate


def dummy_pool(busy_iters: int) -> Callable[[int, int], EnvPool]:
    def make(num_envs: int, threads: int) -> EnvPool:
        # auto_reset keeps every env playing for as long as the benchmark runs.
        return EnvPool(
            "dummy",
            num_envs,
            num_threads=threads,
            auto_reset=True,
            max_steps=None,
            episode_len=20,
            busy_iters=busy_iters,
        )

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


def alfworld_pool(num_envs: int, threads: int) -> EnvPool:
    group = min(ALFWORLD_GROUP, num_envs)
    num_groups = num_envs // group
    games = alfworld_games(num_groups)
    games = [games[g % len(games)] for g in range(num_groups)]
    return EnvPool("alfworld", num_groups * group, group_size=group, games=games, num_threads=threads,
                   auto_reset=True, max_steps=None)


def bench_reference(num_envs: int, seconds: float) -> float:
    """The original Python engine, one env after another (no pool)."""
    import textworld  # noqa: F401  (fails clearly when alfworld/textworld is missing)
    import textworld.gym
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos

    games = alfworld_games(num_envs)
    infos = textworld.EnvInfos(admissible_commands=True, won=True)
    env_id = textworld.gym.register_games(
        games, infos, batch_size=1, asynchronous=False, max_episode_steps=10_000,
        wrappers=[AlfredDemangler, AlfredInfos],
    )
    env = textworld.gym.make(env_id)
    env.reset()

    def once() -> int:
        _, _, dones, _ = env.step([ACTION])
        if dones[0]:
            env.reset()
        return 1

    return _timed(once, seconds)


def bench_prompts(batch: int, games: int, seconds: float) -> None:
    """Prompts per second: Rust cold / warm piece cache vs Python, same requests, same run."""
    import tempfile
    from pathlib import Path

    from transformers import AutoTokenizer

    from pcsd.bench import make_games, prompt_requests, python_prompt
    from pcsd.prompts import PromptBuilder
    from pcsd.testing import make_tiny_model

    with tempfile.TemporaryDirectory(prefix="pcsd-bench-prompts-") as tmp:
        model = make_tiny_model(Path(tmp) / "model")
        paths = make_games(Path(tmp) / "games", games)
        reqs = prompt_requests(paths, max(1, batch // games + 1))[:batch]
        tok = AutoTokenizer.from_pretrained(model)

        def py_batch() -> list[list[int]]:
            out = []
            for r in reqs:
                ids = tok.apply_chat_template([{"role": "user", "content": python_prompt(r, 2)}],
                                              add_generation_prompt=True, tokenize=True)
                out.append(list(ids if isinstance(ids, list) else ids["input_ids"]))
            return out

        def builder() -> PromptBuilder:
            return PromptBuilder("alfworld", history_length=2, max_prompt_tokens=None, tokenizer_dir=model)

        warm = builder()
        rust_ids = [list(ids) for _, ids in warm.build_batch(reqs)]
        assert rust_ids == py_batch(), "Rust and Python token ids differ"

        def timed(fn, fresh: bool) -> float:
            total, n = 0.0, 0
            while n < 3 or total < seconds:
                b = builder() if fresh else warm
                t0 = time.perf_counter()
                fn(b)
                total += time.perf_counter() - t0
                n += 1
            return n * len(reqs) / total

        cold_r = timed(lambda b: b.build_batch(reqs), fresh=True)
        warm_r = timed(lambda b: b.build_batch(reqs), fresh=False)
        py_r = timed(lambda b: py_batch(), fresh=False)
        ntok = sum(map(len, rust_ids)) / len(rust_ids)
        print(f"cpus={os.cpu_count()} load={os.getloadavg()[0]:.1f} batch={len(reqs)} games={games} "
              f"mean prompt tokens={ntok:.0f} (ids equal: yes)")
        print(f"{'rust cold cache':>18s} {cold_r:12,.0f} prompts/s  {cold_r / py_r:6.1f}x python")
        print(f"{'rust warm cache':>18s} {warm_r:12,.0f} prompts/s  {warm_r / py_r:6.1f}x python")
        print(f"{'python':>18s} {py_r:12,.0f} prompts/s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", nargs="+", default=["dummy"], choices=["dummy", "alfworld", "reference"])
    ap.add_argument("--sizes", nargs="+", type=int, default=[128, 1024, 4096])
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--busy-iters", nargs="+", type=int, default=[0, 5000], help="dummy env CPU work per step")
    ap.add_argument("--seconds", type=float, default=1.0, help="time per measurement")
    ap.add_argument("--prompts", action="store_true", help="measure prompt building instead of env steps")
    ap.add_argument("--batch", type=int, default=256, help="--prompts: prompts per batch")
    ap.add_argument("--games", type=int, default=8, help="--prompts: procedural games the observations come from")
    args = ap.parse_args()
    if args.prompts:
        bench_prompts(args.batch, args.games, args.seconds)
        return

    makers: list[tuple[str, Callable[[int, int], EnvPool]]] = []
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
                    pool = make(n, t)
                except (ValueError, RuntimeError) as exc:
                    print(f"skip {name} n={n} t={t}: {exc}", flush=True)
                    continue
                for mode, fn in (("sync", bench_sync), ("async", bench_async)):
                    rate = fn(pool, args.seconds)
                    rows.append(Row(name, n, t, mode, rate))
                    print(f"  {name:18s} envs={n:5d} threads={t} {mode:5s} {rate:12,.0f} steps/s", flush=True)
                pool.close()
    if "reference" in args.engines:
        for n in args.sizes[:1]:
            try:
                rate = bench_reference(n, args.seconds)
                rows.append(Row("alfworld-reference", n, 1, "seq", rate))
            except Exception as exc:  # missing package / data: report and go on
                print(f"skip reference: {type(exc).__name__}: {exc}", flush=True)

    by = {(r.engine, r.num_envs, r.threads, r.mode): r.steps_per_s for r in rows}
    t_lo, t_hi = min(args.threads), max(args.threads)
    print()
    hdr = f"{'engine':18s} {'envs':>5s} {'thr':>3s} {'sync steps/s':>14s} {'async steps/s':>14s} {'async/sync':>10s}"
    hdr += f" {f'sync {t_hi}t/{t_lo}t':>12s} {f'async {t_hi}t/{t_lo}t':>13s}"
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        if r.mode != "sync":
            continue
        a = by.get((r.engine, r.num_envs, r.threads, "async"), float("nan"))
        line = f"{r.engine:18s} {r.num_envs:5d} {r.threads:3d} {r.steps_per_s:14,.0f} {a:14,.0f} {a / r.steps_per_s:10.2f}"
        if r.threads == t_hi and t_hi != t_lo:
            s1 = by.get((r.engine, r.num_envs, t_lo, "sync"))
            a1 = by.get((r.engine, r.num_envs, t_lo, "async"))
            if s1 and a1:
                line += f" {r.steps_per_s / s1:12.2f} {a / a1:13.2f}"
        print(line)
    for r in rows:
        if r.mode == "seq":
            print(f"{r.engine:18s} {'1':>5s} {'1':>3s} {r.steps_per_s:14,.0f}   (sequential Python engine)")


if __name__ == "__main__":
    main()
