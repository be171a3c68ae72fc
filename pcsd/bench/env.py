"""``python -m pcsd.bench env``: the native env pool (sync and async, 1..N threads) vs the real
alfworld engine stepped one env at a time and in a Python multiprocessing pool; with ``--python``
the pool of Python text envs instead (:mod:`pcsd.bench.pyenv`)."""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Sequence

from pcsd.bench import pyenv
from pcsd.bench.common import amdahl, emit, measure, measure_pool, pos_int, rel_spread

_SAFE_PREFIXES = ("go to ", "examine ", "look", "inventory")  # never win, so episodes run to the limit


def make_games(dirpath: Path, count: int, seed: int = 0) -> list[str]:
    """``count`` procedural games (task types round-robin) under ``dirpath``."""
    from pcsd.envs.procedural import TASK_TYPES, write_game

    return [
        str(write_game(dirpath / f"g{i:04d}" / "game.tw-pddl", TASK_TYPES[i % len(TASK_TYPES)], seed + i))
        for i in range(count)
    ]


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
    pool = EnvPool(
        "alfworld",
        num_envs,
        group_size=group,
        games=[games[i] for i in gi],
        max_steps=L,
        num_threads=threads,
        auto_reset=True,
    )
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
    pool = EnvPool(
        "alfworld",
        num_envs,
        group_size=group,
        games=[games[i] for i in gi],
        max_steps=L,
        num_threads=threads,
        auto_reset=True,
    )
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

    if args.python:
        return pyenv.run(args)
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
                rows.append(
                    dict(
                        engine="native pool",
                        envs=n,
                        threads=t,
                        sync_steps_per_s=total / ms["median_s"],
                        sync_spread_rel=rel_spread(ms),
                        async_steps_per_s=total / ma["median_s"],
                        async_spread_rel=rel_spread(ma),
                        sync_per_core=total / ms["median_s"] / t,
                        async_vs_sync=ms["median_s"] / ma["median_s"],
                        sync_serial_ns=ms["serial_ns"],
                        sync_worker_ns=ms["worker_ns"],
                        sync_serial_share=ms["serial_share"],
                        async_serial_ns=ma["serial_ns"],
                        async_worker_ns=ma["worker_ns"],
                        async_serial_share=ma["serial_share"],
                        load=os.getloadavg()[0],
                    )
                )
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
            rows.append(
                dict(
                    engine="alfworld, 1 env at a time",
                    envs=n_real,
                    threads=1,
                    sync_steps_per_s=real_rate,
                    sync_spread_rel=rel_spread(mr),
                    sync_per_core=real_rate,
                    reset_s=reset_s,
                )
            )
            n_mp = max(args.mp_envs, max(threads))
            mp_steps = args.mp_steps or cycle
            for w in threads:
                ms, ma = _real_mp_rates(games, streams, n_mp, w, mp_steps, args.repeats)
                total = n_mp * mp_steps
                rows.append(
                    dict(
                        engine="alfworld mp pool",
                        envs=n_mp,
                        threads=w,
                        sync_steps_per_s=total / ms["median_s"],
                        sync_spread_rel=rel_spread(ms),
                        async_steps_per_s=total / ma["median_s"],
                        async_spread_rel=rel_spread(ma),
                        sync_per_core=total / ms["median_s"] / min(w, ncpu),
                        async_vs_sync=ms["median_s"] / ma["median_s"],
                    )
                )
            mp_rows = {r["threads"]: r for r in rows if r["engine"] == "alfworld mp pool"}
            for r in rows:
                if r["engine"] == "native pool":
                    r["per_core_vs_real"] = r["sync_per_core"] / real_rate
                    r["sync_vs_real"] = r["sync_steps_per_s"] / real_rate
                    m = mp_rows[r["threads"]]
                    r["sync_vs_mp"] = r["sync_steps_per_s"] / m["sync_steps_per_s"]
                    r["async_vs_mp"] = r["async_steps_per_s"] / m["async_steps_per_s"]
            notes.append(
                f"the real-engine rows are measured on fewer envs (their `envs` column) than the native pool "
                f"and compared per env-step: the single engine steps {n_real} game(s) one after another "
                f"({real_steps} steps per repeat, median reset {reset_s:.3f} s); the mp pool holds "
                f"{n_mp} real envs split over `threads` worker processes (multiprocessing, fork, pipes; "
                f"env e plays game e mod {len(games)}), {mp_steps} steps per env per repeat, async = "
                "serve whichever worker answers first; per core = steps/s / min(workers, cores)"
            )
            notes.append(
                "sync_vs_mp / async_vs_mp: native pool vs the mp pool with as many worker processes as "
                "the pool has threads"
            )
    for r in rows:  # scaling from the fewest threads / worker processes, per engine and size
        if "async_steps_per_s" in r:
            b = min(
                (x for x in rows if x["engine"] == r["engine"] and x["envs"] == r["envs"]), key=lambda x: x["threads"]
            )
            r["sync_scaling_vs_1thr"] = r["sync_steps_per_s"] / b["sync_steps_per_s"]
            r["async_scaling_vs_1thr"] = r["async_steps_per_s"] / b["async_steps_per_s"]
            if "sync_serial_share" in b and r["threads"] > b["threads"]:  # what the 1-thread CPU split allows
                r["sync_amdahl_bound"] = amdahl(b["sync_serial_share"], r["threads"] // b["threads"])
                r["async_amdahl_bound"] = amdahl(b["async_serial_share"], r["threads"] // b["threads"])
    notes.append(
        f"{len(games)} procedural games, groups of {args.group_size} envs, command streams of "
        f"{args.stream_len} safe commands then a reset (in every engine); native: {steps} steps per "
        "env per repeat; threads = pool threads (native) or worker processes (mp pool)"
    )
    notes.append(
        "CPU split of the native pool, per env step: serial_ns = the calling thread (Python, argument and "
        "result conversion with the GIL held, dispatch; it never runs in parallel), worker_ns = the pool's "
        "worker threads; serial_share = serial / (serial + worker). CPU time stays meaningful on a loaded "
        "machine, where wall-time scaling does not (see `load`, the 1-minute load average); "
        "*_amdahl_bound = 1 / (s + (1 - s) / k) for k times the threads, s from the fewest-threads row"
    )
    cols = [
        "engine",
        "envs",
        "threads",
        "sync_steps_per_s",
        "sync_spread_rel",
        "async_steps_per_s",
        "async_spread_rel",
        "async_vs_sync",
        "sync_per_core",
        "sync_scaling_vs_1thr",
        "async_scaling_vs_1thr",
        "sync_serial_ns",
        "sync_worker_ns",
        "sync_serial_share",
        "async_serial_ns",
        "async_worker_ns",
        "async_serial_share",
        "sync_amdahl_bound",
        "async_amdahl_bound",
        "load",
        "per_core_vs_real",
        "sync_vs_real",
        "sync_vs_mp",
        "async_vs_mp",
        "reset_s",
    ]

    def plot(ax, rows):
        for n in sorted({r["envs"] for r in rows if r["engine"] == "native pool"}):
            rs = [r for r in rows if r["engine"] == "native pool" and r["envs"] == n]
            x = [r["threads"] for r in rs]
            ax.plot(x, [r["sync_steps_per_s"] for r in rs], "o-", label=f"native sync {n} envs")
            ax.plot(x, [r["async_steps_per_s"] for r in rs], "s--", label=f"native async {n} envs")
        rs = [r for r in rows if r["engine"] == "alfworld mp pool"]
        if rs:
            ax.plot(
                [r["threads"] for r in rs],
                [r["sync_steps_per_s"] for r in rs],
                "o-",
                color="red",
                label=f"alfworld mp pool sync ({rs[0]['envs']} envs)",
            )
            ax.plot(
                [r["threads"] for r in rs],
                [r["async_steps_per_s"] for r in rs],
                "s--",
                color="red",
                label="alfworld mp pool async",
            )
        for r in rows:
            if r["engine"] == "alfworld, 1 env at a time":
                ax.axhline(r["sync_steps_per_s"], color="black", ls=":", label="alfworld, 1 env at a time")
        ax.set_xlabel("threads (native) / worker processes (mp pool)")
        ax.set_ylabel("env steps/s")
        ax.set_yscale("log")
        ax.legend(fontsize=6)

    payload = emit(
        "env",
        "Env pool: native alfworld engine vs the real alfworld engine (alone and in a multiprocessing pool)",
        rows,
        cols,
        Path(args.out),
        args,
        notes,
        plot,
    )
    webshop_root = args.webshop or os.environ.get("WEBSHOP_DATA")
    if webshop_root:
        payload["webshop"] = cmd_env_webshop(Path(webshop_root), args)
    return payload


def cmd_env_webshop(root: Path, args) -> dict:
    """WebShop rows: native per step by action kind vs the original's recorded per-step times, and
    a synthetic-catalogue scale row."""
    from pcsd.bench import webshop

    rows = webshop.per_kind_rows(root, max(1, args.repeats))
    for n in args.webshop_products:
        rows.append(webshop.scale_row(root, n))
    notes = [
        "original_ms: median per env.step of princeton-nlp/WebShop (pyserini/Lucene, spaCy, Flask templates, "
        "bs4) recorded with the same actions in traces_public.jsonl.gz on a 2-core machine (FACTS.md); native_us: "
        "the same steps through pcsd.envs.webshop (Python call included), median over the replays; speedup = "
        "original / native per step on one core",
        "scale rows: synthetic catalogues built like the real one (pcsd.bench.webshop.synthetic_catalogue), "
        "loaded twice, each in a fresh process: cold_load_s = streaming JSON load + index build + goals + the index "
        "cache written, cached_load_s = the cache mapped + goals; rss_mib (anon / file) / rss_added_mib / "
        "peak_rss_mib = resident memory after the cached load / added by it / at its peak; search = WebShop.search "
        "(pruned, block-max MaxScore) and exhaustive = every matching posting scored, on the same goal "
        "instructions in the same process (analyzer + BM25 + top 50); pruned_differs = searches whose hits differ",
    ]
    cols = [
        "engine",
        "action",
        "steps",
        "native_us",
        "original_ms",
        "speedup",
        "products",
        "goals",
        "catalogue_gb",
        "cache_gb",
        "cold_load_s",
        "cached_load_s",
        "rss_mib",
        "rss_anon_mib",
        "rss_file_mib",
        "peak_rss_mib",
        "search_p50_us",
        "search_p99_us",
        "exhaustive_p50_us",
        "exhaustive_p99_us",
        "search_speedup_p50",
        "pruned_differs",
        "original_lucene_query_ms",
    ]
    return emit(
        "env_webshop",
        "WebShop: native engine per step vs the original, and a large catalogue",
        rows,
        cols,
        Path(args.out),
        args,
        notes,
    )


NAME = "env"
HELP = "native env pool vs the real alfworld engine (alone and in a process pool); --python: Python text envs"
#: sizes: (full, --quick, --tiny); --tiny is for the tests (seconds)
DEFAULTS: dict[str, tuple] = dict(
    sizes=([128, 1024, 4096], [128, 1024], [16]),
    repeats=(5, 3, 2),
    games=(64, 16, 2),
    real_games=(4, 2, 1),
    stream_len=(10, 10, 3),
    mp_envs=(16, 4, 2),
    webshop_products=([100_000], [20_000], [2_000]),
    **pyenv.DEFAULTS,
)


def pool_size(s: str) -> int:
    """A ``--sizes`` value: a positive int no larger than the native pool's limit (checked before
    any game is made, not when the pool of that size is built)."""
    from pcsd.envs.pool import MAX_ENVS

    v = pos_int(s)
    if v > MAX_ENVS:
        raise argparse.ArgumentTypeError(f"at most {MAX_ENVS} envs per pool (the native pool's limit), got {v}")
    return v


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sizes", type=pool_size, nargs="+", help="pool sizes (envs)")
    p.add_argument(
        "--threads",
        type=pos_int,
        nargs="+",
        help="native pool threads and mp-pool worker processes (default 1 .. all cores)",
    )
    p.add_argument("--steps", type=pos_int, help="native steps per env per timed repeat (default: one episode cycle)")
    p.add_argument("--games", type=pos_int, help="distinct procedural games")
    p.add_argument("--group-size", type=pos_int, default=8, help="envs per game (GRPO group)")
    p.add_argument("--stream-len", type=pos_int, help="commands per episode before the reset")
    p.add_argument(
        "--real-steps",
        type=pos_int,
        help="single real engine: steps per timed repeat (default: one episode cycle per game)",
    )
    p.add_argument("--real-games", type=pos_int, help="games the real engine plays")
    p.add_argument("--mp-envs", type=pos_int, help="real alfworld envs in the multiprocessing pool")
    p.add_argument(
        "--mp-steps", type=pos_int, help="mp-pool steps per env per timed repeat (default: one episode cycle)"
    )
    p.add_argument("--no-real", action="store_true", help="skip the real alfworld engine (alone and mp pool)")
    p.add_argument("--webshop", help="WebShop data folder (default $WEBSHOP_DATA): adds the WebShop rows")
    p.add_argument(
        "--webshop-products",
        type=pos_int,
        nargs="+",
        help="products in the synthetic WebShop scale rows (the full catalogue, 1181436: "
        "benchmarks/webshop_catalogue.py)",
    )
    pyenv.add_arguments(p)


run = cmd_env
