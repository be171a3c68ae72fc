"""Methods x seeds on the same evaluation games (not a test): success before/after RL with paired
standard errors, and each method's mean gap and gate activation per step.

    python benchmarks/compare_methods.py                                   # 6 methods x 3 seeds, tiny-cpu
    python benchmarks/compare_methods.py --methods grpo,pcsd --seeds 0,1,2 --out runs/compare
    python benchmarks/compare_methods.py --methods grpo,skill-sd --seeds 0,1 -- optim.steps=1 ...

Per seed the warm-up (the tiny model, its tokenizer and the SFT on the expert) runs once
(``method=vanilla``, i.e. ``optim.steps=0``: its evaluation is every method's evaluation before
RL; the method runs skip theirs with ``eval.before=false``), and every method starts RL from that
``sft-model/`` (``model.path=... optim.sft_steps=0``), so within a seed the methods differ only in
their RL. The teacher check (``--no-teacher-check`` skips it) evaluates the same SFT model with the
skills in its prompt (``method=skill-prompt``): the PCSD teacher's own success vs the student's. The evaluation games are the trainer's fixed list (their seed
does not depend on ``run.seed``), every game played once with a fixed sampling seed, so results
pair up game by game and seed by seed.

Standard errors, in percentage points:
  * ``rise SE``: the seeds' mean of (after - before), sd over seeds / sqrt(seeds);
  * ``vs BASE``: the mean over seeds of (method after - BASE after) with its paired SE over seeds
    (BASE = ``--baseline``, grpo by default), and the game-level paired SE (sd of the per-game
    differences over all seeds and games / sqrt(their number); it ignores the correlation of games
    within a seed, so read it as a lower bound).
Figures: ``curves_<method>.png`` (mean gap and gate activation per RL step, one line per seed)
and ``success.png``. Arguments after ``--`` go to every ``pcsd.train`` run (e.g. a smaller size).
Do not tune a method on the evaluation games.

An entry of ``--methods`` is a method (``pcsd``, ``grpo+opsd``), an advantage estimator alone
(``gigpo``, ``rloo``: GRPO's method with that estimator, ``method=grpo algo.estimator=NAME``) or
``ESTIMATOR+METHOD`` (``gigpo+pcsd``: ``method=pcsd algo.estimator=gigpo``, GiGPO + PCSD). A name
that is a method is the method (``grpo``, ``grpo+opsd``); the estimator of a plain method is the
preset's.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_METHODS = ("grpo", "grpo+opsd", "sdar", "rlsd", "pcsd", "skill-sd")


def _train(args: list[str], timeout: float, log: Path, extra_env: dict[str, str] | None = None) -> float:
    cmd = [sys.executable, "-m", "pcsd.train", *args]
    print(f"$ {' '.join(cmd)}", flush=True)
    t0 = time.time()
    with open(log, "w") as f:
        # this checkout's pcsd, also under PYTHONSAFEPATH=1 (which keeps the cwd off sys.path)
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
            **(extra_env or {}),
        )
        proc = subprocess.run(cmd, cwd=ROOT, env=env, timeout=timeout, stdout=f, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise SystemExit(f"pcsd.train failed ({proc.returncode}); see {log}")
    return time.time() - t0


def _games(run_dir: Path, which: str) -> list[dict]:
    ev = json.loads((run_dir / "eval.json").read_text())
    return ev[which]["games"]


def _game_key(path: str) -> str:
    """A game's identity across run directories: its file name and a hash of its content
    (procedural games are regenerated, identically, in every run directory)."""
    import hashlib

    p = Path(path)
    digest = hashlib.sha1(p.read_bytes()).hexdigest()[:12] if p.is_file() else "?"
    return f"{p.name}:{digest}"


def _metrics(run_dir: Path) -> list[dict]:
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [r for r in recs if "gap_mean" in r]


def entry_overrides(entry: str) -> list[str]:
    """The ``pcsd.train`` overrides of one ``--methods`` entry (see the module docs); SystemExit
    naming the entry when it is neither a method nor ESTIMATOR[+METHOD]."""
    from pcsd.ops.estimators import available_estimators
    from pcsd.train.methods import METHODS

    if canonical_method_or_none(entry) is not None:
        return [f"method={canonical_method_or_none(entry)}"]
    est, _, method = entry.partition("+")
    resolved = canonical_method_or_none(method or "grpo")
    if est in available_estimators() and resolved is not None:
        return [f"method={resolved}", f"algo.estimator={est}"]
    raise SystemExit(
        f"--methods: {entry!r} is neither a method ({', '.join(METHODS)}) nor ESTIMATOR or ESTIMATOR+METHOD "
        f"(estimators: {', '.join(available_estimators())})"
    )


def canonical_method_or_none(name: str) -> str | None:
    from pcsd.train.methods import canonical_method

    try:
        return canonical_method(name)
    except ValueError:
        return None


def _mean_se(xs: list[float]) -> tuple[float, float]:
    n = len(xs)
    if not n:
        return float("nan"), float("nan")
    m = sum(xs) / n
    if n < 2:
        return m, float("nan")
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    return m, sd / math.sqrt(n)


def _eval_after(run_dir: Path) -> tuple[float, list[int], list[str]]:
    games = _games(run_dir, "after")
    won = [int(g["won"]) for g in games]
    return 100.0 * sum(won) / len(won), won, [_game_key(g["game"]) for g in games]


def run_all(
    methods: list[str],
    seeds: list[int],
    out: Path,
    overrides: list[str],
    timeout: float,
    teacher_check: bool = True,
    warm_up: Path | None = None,
    jobs: int = 1,
    train: bool = True,
) -> tuple[dict, dict]:
    """Per seed: the warm-up, the teacher check (the SFT model with the skills in its prompt,
    ``method=skill-prompt``), then every method's RL from the SFT model. The evaluation before RL
    is the warm-up's (``eval.before=false`` in the method runs: the same model, games and seed).
    ``warm_up``: one warm-up run directory for every seed (the seeds then vary the RL only).
    ``jobs``: method runs at a time (each with ``OMP_NUM_THREADS`` = cores / jobs). ``train=False``:
    only collect the runs that finished (a partial comparison)."""
    from concurrent.futures import ThreadPoolExecutor

    teacher: dict = {}
    warm_of: dict[int, Path] = {}
    for seed in seeds:
        warm = warm_up if warm_up is not None else out / f"seed-{seed}" / "warm-up"
        warm_of[seed] = warm
        if not (warm / "summary.json").is_file():
            if warm_up is not None:
                raise SystemExit(f"--warm-up {warm_up}: no summary.json there (not a finished pcsd run)")
            # optim.steps=0 after the overrides: the warm-up trains no RL whatever they say
            _train(
                [
                    f"run.dir={warm}",
                    "method=vanilla",
                    f"run.seed={seed}",
                    *overrides,
                    "optim.steps=0",
                    "eval.before=false",
                ],
                timeout,
                out / f"warm-up-{seed}.log",
            )
        key = "shared" if warm_up is not None else seed
        if teacher_check and key not in teacher:
            rd = out / ("teacher-check" if warm_up is not None else f"seed-{seed}/teacher-check")
            if not train and not (rd / "summary.json").is_file():
                continue
            if not (rd / "summary.json").is_file():
                _train(
                    [
                        f"run.dir={rd}",
                        "method=skill-prompt",
                        f"run.seed={seed}",
                        f"model.path={_model(warm)}",
                        *overrides,
                        "optim.steps=0",
                        "optim.sft_steps=0",
                        "eval.before=false",
                    ],
                    timeout,
                    out / f"teacher-check-{key}.log",
                )
            before, games_before, names_before = _eval_after(warm)
            t_after, t_games, t_names = _eval_after(rd)
            if t_names != names_before:
                raise SystemExit(f"{rd}: the teacher check's evaluation games differ from the warm-up's")
            teacher[key] = dict(student=before, teacher=t_after, games_student=games_before, games_teacher=t_games)
    todo = [(seed, m) for seed in seeds for m in methods if not (out / f"seed-{seed}" / m / "summary.json").is_file()]
    threads = max(1, (os.cpu_count() or 1) // max(1, jobs))

    def one(item: tuple[int, str]) -> None:
        seed, m = item
        rd = out / f"seed-{seed}" / m
        _train(
            [
                f"run.dir={rd}",
                *entry_overrides(m),
                f"run.seed={seed}",
                f"model.path={_model(warm_of[seed])}",
                *overrides,
                "optim.sft_steps=0",
                "eval.before=false",
            ],
            timeout,
            out / f"{m}-{seed}.log",
            extra_env={"OMP_NUM_THREADS": str(threads)} if jobs > 1 else None,
        )

    if train:
        with ThreadPoolExecutor(max(1, jobs)) as pool:
            list(pool.map(one, todo))
    runs: dict = {}
    for seed in seeds:
        before, games_before, names_before = _eval_after(warm_of[seed])
        for m in methods:
            rd = out / f"seed-{seed}" / m
            if not train and not (rd / "summary.json").is_file():
                continue
            s = json.loads((rd / "summary.json").read_text())
            after, games_after, names = _eval_after(rd)
            if names != names_before:
                raise SystemExit(f"{m} seed {seed}: evaluation games differ from the warm-up's")
            runs.setdefault(m, {})[seed] = dict(
                dir=str(rd),
                before=before,
                after=after,
                wall=s.get("wall_seconds", float("nan")),
                games_before=games_before,
                games_after=games_after,
                game_names=names,
                curve=[
                    dict(step=r["step"], gap=r["gap_mean"], gate=r["gate_activation"], success=r.get("success"))
                    for r in _metrics(rd)
                ],
            )
    return runs, teacher


def _model(warm: Path) -> Path:
    return warm / "sft-model" if (warm / "sft-model" / "config.json").is_file() else warm / "base-model"


def summarize_teacher(teacher: dict) -> dict:
    """Teacher (skills in the prompt) minus student (no skills), the same SFT model before RL:
    per seed, the mean over seeds with its SE, and the game-level paired SE."""
    if not teacher:
        return {}
    seeds = sorted(teacher)
    d = [100.0 * (a - b) for s in seeds for a, b in zip(teacher[s]["games_teacher"], teacher[s]["games_student"])]
    return dict(
        seeds=seeds,
        student=_mean_se([teacher[s]["student"] for s in seeds]),
        teacher=_mean_se([teacher[s]["teacher"] for s in seeds]),
        diff=_mean_se([teacher[s]["teacher"] - teacher[s]["student"] for s in seeds]),
        diff_game_se=_mean_se(d)[1],
        per_seed={s: dict(student=teacher[s]["student"], teacher=teacher[s]["teacher"]) for s in seeds},
    )


def summarize(runs: dict, baseline: str) -> dict:
    out: dict = {}
    base = runs.get(baseline, {})
    for m, per in runs.items():
        seeds = sorted(per)
        rises = [per[s]["after"] - per[s]["before"] for s in seeds]
        row = dict(
            seeds=seeds,
            before=_mean_se([per[s]["before"] for s in seeds]),
            after=_mean_se([per[s]["after"] for s in seeds]),
            rise=_mean_se(rises),
        )
        common = [s for s in seeds if s in base]
        if m != baseline and common:
            for s in common:  # the same games in the same order, or the pairing is meaningless
                if per[s]["game_names"] != base[s]["game_names"]:
                    raise SystemExit(f"{m} seed {s}: evaluation games differ from {baseline}'s")
            row["vs_base"] = _mean_se([per[s]["after"] - base[s]["after"] for s in common])
            d = [100.0 * (a - b) for s in common for a, b in zip(per[s]["games_after"], base[s]["games_after"])]
            row["vs_base_game_se"] = _mean_se(d)[1]
        out[m] = row
    return out


def report(summary: dict, baseline: str, runs: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"Methods x seeds on the same evaluation games (mean ± SE over seeds, pp); baseline {baseline}")
    for c in (
        "method",
        "seeds",
        "before %",
        "after %",
        "rise (pp)",
        f"after - {baseline} (pp)",
        "game-paired SE",
        "mean gap (last step)",
        "gate (last step)",
    ):
        t.add_column(c, justify="right")
    f = lambda ms: f"{ms[0]:.1f} ± {ms[1]:.1f}" if not math.isnan(ms[1]) else f"{ms[0]:.1f}"  # noqa: E731
    for m, r in summary.items():
        last = [runs[m][s]["curve"][-1] for s in r["seeds"] if runs[m][s]["curve"]]
        gap = sum(x["gap"] for x in last) / len(last) if last else float("nan")
        gate = sum(x["gate"] for x in last) / len(last) if last else float("nan")
        t.add_row(
            m,
            str(len(r["seeds"])),
            f(r["before"]),
            f(r["after"]),
            f(r["rise"]),
            f(r["vs_base"]) if "vs_base" in r else "-",
            f"{r['vs_base_game_se']:.1f}" if "vs_base_game_se" in r else "-",
            f"{gap:+.3f}",
            f"{gate:.3f}",
        )
    Console(width=None if sys.stdout.isatty() else 180).print(t)


def markdown(summary: dict, baseline: str, runs: dict, teacher: dict) -> str:
    """The table of :func:`report` and the teacher check, in markdown (``compare.md``)."""
    f = lambda ms: f"{ms[0]:.1f} ± {ms[1]:.1f}" if not math.isnan(ms[1]) else f"{ms[0]:.1f}"  # noqa: E731
    lines = []
    if teacher:
        lines += [
            "| policy (same SFT model, before RL) | success % |",
            "|---|---|",
            f"| student, no skills | {f(teacher['student'])} |",
            f"| teacher, skills in the prompt | {f(teacher['teacher'])} |",
            f"| teacher - student (pp) | {teacher['diff'][0]:+.1f} (game-paired SE {teacher['diff_game_se']:.1f}) |",
            "",
        ]
    lines += [
        f"| method | seeds | before % | after % | rise (pp) | after - {baseline} (pp) | game-paired SE | "
        "mean gap (last step) | gate (last step) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for m, r in summary.items():
        last = [runs[m][s]["curve"][-1] for s in r["seeds"] if runs[m][s]["curve"]]
        gap = sum(x["gap"] for x in last) / len(last) if last else float("nan")
        gate = sum(x["gate"] for x in last) / len(last) if last else float("nan")
        lines.append(
            f"| {m} | {len(r['seeds'])} | {f(r['before'])} | {f(r['after'])} | {f(r['rise'])} | "
            + (f"{r['vs_base'][0]:+.1f} ± {r['vs_base'][1]:.1f}" if "vs_base" in r else "-")
            + " | "
            + (f"{r['vs_base_game_se']:.1f}" if "vs_base_game_se" in r else "-")
            + f" | {gap:+.3f} | {gate:.3f} |"
        )
    return "\n".join(lines) + "\n"


def plot(runs: dict, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for m, per in runs.items():
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(8, 3))
        for s, r in sorted(per.items()):
            steps = [c["step"] for c in r["curve"]]
            a1.plot(steps, [c["gap"] for c in r["curve"]], marker=".", label=f"seed {s}")
            a2.plot(steps, [c["gate"] for c in r["curve"]], marker=".", label=f"seed {s}")
        a1.set_title(f"{m}: mean teacher-student gap")
        a2.set_title(f"{m}: gate activation (w > 0.5)")
        for a in (a1, a2):
            a.set_xlabel("RL step")
            a.legend(fontsize=7)
        fig.tight_layout()
        p = out / f"curves_{m.replace('+', '_')}.png"
        fig.savefig(p, dpi=120)
        plt.close(fig)
        paths.append(p)
    fig, ax = plt.subplots(figsize=(1.2 * len(runs) + 2, 3))
    for i, (m, per) in enumerate(runs.items()):
        for s, r in per.items():
            ax.plot([i - 0.1, i + 0.1], [r["before"], r["after"]], color="0.6", lw=0.8)
            ax.scatter([i + 0.1], [r["after"]], s=12, color="C0")
    ax.set_xticks(range(len(runs)), list(runs), rotation=20)
    ax.set_ylabel("success % (before -> after)")
    fig.tight_layout()
    p = out / "success.png"
    fig.savefig(p, dpi=120)
    plt.close(fig)
    return paths + [p]


# ----------------------------------------------------------------------------- the evidence comparison
# (issue 38, docs/evidence.md): preset tiny-cpu-evidence, every rule under two estimators and two noise
# levels, many RL runs per process, the statistics of rliable, P1-P5 judged.

#: the methods of the evidence comparison: every distillation rule, PCSD's ablations, the negative control
EVIDENCE_METHODS = (
    "grpo",
    "grpo+opsd",
    "sdar",
    "rlsd",
    "skill-sd",
    "pcsd",
    "pcsd-fixed-n1",
    "pcsd-fixed-n4",
    "pcsd-no-trend",
    "pcsd-no-decay",
    "negctl",
)
#: the negative control: PCSD with every teacher gap negated (an experiment setting, not a method)
NEGATIVE_CONTROL = ("negctl", ["method=pcsd", "experiment.negate_gap=true"])
#: the noise levels: none, and the paper's two forms together (a share of episodes whose teacher reads a
#: wrong rule or a distractor, and i.i.d. token-level noise on every gap before any rule reads it)
NOISE_LEVELS = {
    "clean": [],
    "noisy": ["env.kwargs.rule_noise=0.25", "experiment.gap_noise=1.0", "experiment.gap_noise_rho=0.0"],
}
EVIDENCE_ESTIMATORS = ("grpo", "gigpo")
#: the distillation coefficient of the comparison (docs/evidence.md: the paper's 0.01 pulls a token ~1/100
#: as hard as the policy gradient does)
EVIDENCE_LAMBDA = 1.0
DISTILLERS = ("grpo+opsd", "sdar", "rlsd", "skill-sd", "pcsd")
ABLATIONS = ("pcsd-fixed-n1", "pcsd-fixed-n4", "pcsd-no-trend", "pcsd-no-decay")


def evidence_overrides(method: str, estimator: str, noise: str) -> list[str]:
    """The ``pcsd.train`` overrides of one cell of the evidence comparison (the preset comes first)."""
    if noise not in NOISE_LEVELS:
        raise SystemExit(f"--noise: {noise!r} is not a noise level ({', '.join(NOISE_LEVELS)})")
    ov = list(NEGATIVE_CONTROL[1]) if method == NEGATIVE_CONTROL[0] else entry_overrides(method)
    # the rules that read lambda (not grpo, rlsd, nor skill-sd, which sets its own 0.001)
    lam = [f"algo.lambda_distill={EVIDENCE_LAMBDA}"] if method not in ("grpo", "rlsd", "skill-sd") else []
    return [*ov, *lam, f"algo.estimator={estimator}", *NOISE_LEVELS[noise]]


def _run_in_process(item: tuple[list[str], str, str]) -> tuple[str, int, float]:
    """One ``pcsd.train`` run in this (pool worker) process: ``main(args)``, its output to ``log``."""
    import contextlib

    args, log, rd = item
    if (Path(rd) / "summary.json").is_file():
        return rd, 0, 0.0
    import torch

    torch.set_num_threads(1)
    from pcsd.train.cli import main as train_main

    t0 = time.time()
    with open(log, "w") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
        try:
            rc = train_main(args)
        except SystemExit as exc:  # noqa: PERF203
            rc = int(exc.code or 0) if not isinstance(exc.code, str) else 1
    return rd, rc, time.time() - t0


def run_evidence(
    seeds: list[int],
    out: Path,
    overrides: list[str],
    *,
    methods: list[str],
    estimators: list[str],
    noises: list[str],
    jobs: int,
    timeout: float,
    record_gaps: tuple[str, ...] = ("pcsd", "sdar"),
    warm_up: Path | None = None,
) -> dict:
    """Per seed one warm-up and its teacher check (:func:`run_all` without methods), then every cell
    ``(estimator, noise, method, seed)`` from that seed's SFT model, ``jobs`` worker processes each
    running many trainings in-process (``OMP_NUM_THREADS=1``). Cells in the order estimator, noise,
    seed, method, so a comparison cut short has whole estimators first. Returns the cells' records."""
    import multiprocessing as mp

    base = ["preset=tiny-cpu-evidence", *overrides]
    os.environ["OMP_NUM_THREADS"] = "1"
    # the warm-ups and teacher checks: separate processes, `jobs` at a time
    from concurrent.futures import ThreadPoolExecutor

    if warm_up is None:
        with ThreadPoolExecutor(max(1, jobs)) as pool:
            list(pool.map(lambda s: run_all([], [s], out, base, timeout, True, None, 1, True), seeds))
    _, teacher = run_all([], seeds, out, base, timeout, True, warm_up, 1, warm_up is not None)
    todo = []
    for est in estimators:
        for noise in noises:
            for seed in seeds:
                for m in methods:
                    rd = out / f"seed-{seed}" / est / noise / m
                    rec = ["run.record_gaps=true"] if m in record_gaps and seed == seeds[0] else []
                    args = [
                        f"run.dir={rd}",
                        *base,
                        *evidence_overrides(m, est, noise),
                        f"run.seed={seed}",
                        f"model.path={_model(warm_up or out / f'seed-{seed}' / 'warm-up')}",
                        "optim.sft_steps=0",
                        "eval.before=false",
                        "run.tensorboard=false",
                        *rec,
                    ]
                    rd.parent.mkdir(parents=True, exist_ok=True)
                    todo.append((args, str(rd.parent / f"{m}.log"), str(rd)))
    t0 = time.time()
    ctx = mp.get_context("spawn")
    failed = []
    with ctx.Pool(max(1, jobs)) as pool:
        for k, (rd, rc, wall) in enumerate(pool.imap(_run_in_process, todo)):
            if rc != 0:
                failed.append(rd)
            print(f"[{k + 1}/{len(todo)}] {rd} rc={rc} {wall:.1f}s (elapsed {time.time() - t0:.0f}s)", flush=True)
    if failed:
        print(f"{len(failed)} runs failed: {failed[:5]}", file=sys.stderr)
    return dict(teacher=teacher, cells=collect_evidence(out, seeds, methods, estimators, noises))


def collect_evidence(out: Path, seeds: list[int], methods: list[str], estimators: list[str], noises: list[str]) -> dict:
    """``{est: {noise: {method: {seed: record}}}}`` of the finished cells under ``out``: final success
    (evaluation after RL), the per-game results, the training success per RL step, the wall time."""
    cells: dict = {}
    for est in estimators:
        for noise in noises:
            for m in methods:
                for seed in seeds:
                    rd = out / f"seed-{seed}" / est / noise / m
                    if not (rd / "summary.json").is_file():
                        continue
                    s = json.loads((rd / "summary.json").read_text())
                    after, games, names = _eval_after(rd)
                    recs = [json.loads(x) for x in (rd / "metrics.jsonl").read_text().splitlines() if x.strip()]
                    curve = [float(r["success"]) for r in recs if "success" in r and "step" in r and "gap_mean" in r]
                    cells.setdefault(est, {}).setdefault(noise, {}).setdefault(m, {})[seed] = dict(
                        dir=str(rd), after=after, games=games, names=names, curve=curve, wall=s.get("wall_seconds")
                    )
    return cells


def smooth(xs: list[float], k: int = 3) -> list[float]:
    """A trailing moving average over ``k`` steps (the training success per step is noisy)."""
    return [sum(xs[max(0, i - k + 1) : i + 1]) / len(xs[max(0, i - k + 1) : i + 1]) for i in range(len(xs))]


def steps_to(curve: list[float], threshold: float) -> float:
    """The first RL step (1-based) whose smoothed success reaches ``threshold``; inf when none does."""
    for i, x in enumerate(smooth(curve)):
        if x >= threshold:
            return float(i + 1)
    return math.inf


def mean_curve(per: dict) -> tuple[list[float], list[float]]:
    """The seeds' mean smoothed training-success curve and its 95 % half-width (t over seeds)."""
    curves = [smooth(r["curve"]) for r in per.values() if r["curve"]]
    n = min(len(c) for c in curves)
    mean, half = [], []
    t95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}
    for i in range(n):
        col = [c[i] for c in curves]
        m, se = _mean_se(col)
        mean.append(m)
        half.append(t95.get(len(col) - 1, 1.96) * se if not math.isnan(se) else 0.0)
    return mean, half


def game_paired(per: dict, base: dict) -> tuple[float, float, float]:
    """Final success of ``per`` minus ``base``: the mean over seeds and a 95 % interval from the
    game-paired differences (every game of every common seed; independence of games assumed)."""
    common = [s for s in per if s in base]
    d = [100.0 * (a - b) for s in common for a, b in zip(per[s]["games"], base[s]["games"])]
    m, se = _mean_se(d)
    return m, m - 1.96 * se, m + 1.96 * se


def _bootstrap(fn, arrays: list, reps: int, seed: int = 0) -> tuple[float, float, float]:
    """``fn(*arrays)`` and its percentile 95 % interval over a stratified bootstrap: each array's
    runs (rows) resampled with replacement within each task (column), as ``rliable`` stratifies
    (its ``StratifiedBootstrap`` needs the ``arch`` package, whose 8.x no longer takes rliable's
    arguments, so the resampling is written here; the statistics are rliable's own functions)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    point = float(fn(*arrays))
    vals = []
    for _ in range(reps):
        res = []
        for a in arrays:
            idx = rng.integers(0, a.shape[0], size=a.shape)  # per task, runs drawn with replacement
            res.append(np.take_along_axis(a, idx, axis=0))
        vals.append(float(fn(*res)))
    lo, hi = np.percentile(vals, [2.5, 97.5])
    return point, float(lo), float(hi)


def rliable_stats(cell: dict, baseline: str, reps: int = 2000) -> dict:
    """IQM of the final success over seeds (``rliable.metrics.aggregate_iqm``) with a stratified
    bootstrap 95 % interval, and the probability of improvement over ``baseline``
    (``rliable.metrics.probability_of_improvement``) with its interval."""
    import numpy as np
    from rliable import metrics

    scores = {m: np.array([[per[s]["after"] / 100.0] for s in sorted(per)]) for m, per in cell.items() if per}
    out: dict = {}
    for m, x in scores.items():
        p, lo, hi = _bootstrap(metrics.aggregate_iqm, [x], reps)
        out[m] = dict(iqm=100.0 * p, iqm_ci=[100.0 * lo, 100.0 * hi])
        if m != baseline and baseline in scores:
            p, lo, hi = _bootstrap(metrics.probability_of_improvement, [x, scores[baseline]], reps)
            out[m].update(p_improve=p, p_improve_ci=[lo, hi])
    return out


def summarize_evidence(cells: dict, threshold: float) -> dict:
    """Per estimator and noise level, per method: seeds, final success (mean ± SE), steps to the
    threshold (seed-mean curve, and per seed), the game-paired difference to GRPO with its 95 %
    interval, IQM and probability of improvement over GRPO (rliable, when installed)."""
    out: dict = {}
    for est, by_noise in cells.items():
        for noise, cell in by_noise.items():
            rows: dict = {}
            base = cell.get("grpo", {})
            try:
                stats = rliable_stats(cell, "grpo")
            except ImportError:
                stats = {}
            for m, per in cell.items():
                seeds = sorted(per)
                mean, half = mean_curve(per)
                row = dict(
                    seeds=seeds,
                    after=_mean_se([per[s]["after"] for s in seeds]),
                    steps_to=steps_to(mean, threshold),
                    steps_to_per_seed=[steps_to(per[s]["curve"], threshold) for s in seeds],
                    final_train=mean[-1] if mean else float("nan"),
                    curve=mean,
                    band=half,
                    wall=_mean_se([float(per[s]["wall"] or 0.0) for s in seeds]),
                    **stats.get(m, {}),
                )
                if m != "grpo" and base:
                    row["vs_grpo"] = game_paired(per, base)
                rows[m] = row
            out.setdefault(est, {})[noise] = rows
    return out


def judge(summary: dict, diagnostics: dict | None = None) -> dict:
    """P1-P5 (docs/evidence.md) as holds / does not hold, with the numbers each rests on."""
    verdicts: dict = {}

    def cells():
        for est, by_noise in summary.items():
            for noise, rows in by_noise.items():
                yield est, noise, rows

    p1 = []
    for est, noise, rows in cells():
        g = rows.get("grpo")
        for m in DISTILLERS:
            if g and m in rows:
                p1.append(
                    dict(
                        est=est,
                        noise=noise,
                        method=m,
                        steps=rows[m]["steps_to"],
                        grpo=g["steps_to"],
                        holds=rows[m]["steps_to"] < g["steps_to"],
                    )
                )
    verdicts["P1"] = dict(holds=bool(p1) and all(x["holds"] for x in p1), cases=p1)
    p2 = []
    for est in summary:
        diffs = {}
        for noise, rows in summary[est].items():
            if "pcsd" in rows and "sdar" in rows:
                diffs[noise] = rows["pcsd"]["after"][0] - rows["sdar"]["after"][0]
        if diffs:
            grows = "noisy" not in diffs or "clean" not in diffs or diffs["noisy"] > diffs["clean"]
            p2.append(dict(est=est, diffs=diffs, holds=all(d >= 0 for d in diffs.values()) and grows))
    verdicts["P2"] = dict(holds=bool(p2) and all(x["holds"] for x in p2), cases=p2)
    p3 = []
    for est, noise, rows in cells():
        for m in ABLATIONS:
            if "pcsd" in rows and m in rows:
                d = rows["pcsd"]["after"][0] - rows[m]["after"][0]
                p3.append(dict(est=est, noise=noise, ablation=m, pcsd_minus=d, holds=d >= 0))
    verdicts["P3"] = dict(holds=bool(p3) and all(x["holds"] for x in p3), cases=p3)
    p4 = []
    for est, noise, rows in cells():
        if "negctl" in rows and "grpo" in rows:
            n, g = rows["negctl"], rows["grpo"]
            p4.append(
                dict(
                    est=est,
                    noise=noise,
                    steps=n["steps_to"],
                    grpo=g["steps_to"],
                    after=n["after"][0],
                    grpo_after=g["after"][0],
                    holds=n["steps_to"] > g["steps_to"]
                    or (n["steps_to"] == g["steps_to"] and n["after"][0] < g["after"][0]),
                )
            )
    verdicts["P4"] = dict(holds=bool(p4) and all(x["holds"] for x in p4), cases=p4)
    if diagnostics:
        verdicts["P5"] = diagnostics
    return verdicts


def plot_evidence(summary: dict, out: Path, threshold: float) -> list[Path]:
    """One PNG per estimator: success vs RL step (seed mean, 95 % band), a panel per noise level."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for est, by_noise in summary.items():
        fig, axes = plt.subplots(1, len(by_noise), figsize=(6 * len(by_noise), 4), squeeze=False)
        for ax, (noise, rows) in zip(axes[0], by_noise.items()):
            for k, (m, r) in enumerate(rows.items()):
                if not r["curve"]:
                    continue
                x = list(range(1, len(r["curve"]) + 1))
                lo = [a - b for a, b in zip(r["curve"], r["band"])]
                hi = [a + b for a, b in zip(r["curve"], r["band"])]
                style = "--" if m in ABLATIONS else (":" if m == "negctl" else "-")
                lw = 2.2 if m in ("pcsd", "grpo") else 1.1
                ax.plot(x, r["curve"], style, lw=lw, color=f"C{k % 10}", label=m)
                ax.fill_between(x, lo, hi, color=f"C{k % 10}", alpha=0.08)
            ax.axhline(threshold, color="0.5", lw=0.6)
            ax.set_title(f"{est} estimator, {noise}")
            ax.set_xlabel("RL step")
            ax.set_ylabel("training success % (3-step mean; 95 % band over seeds)")
        axes[0][-1].legend(fontsize=7, ncol=2)
        fig.tight_layout()
        p = out / f"evidence_{est}.png"
        fig.savefig(p, dpi=90)
        plt.close(fig)
        paths.append(p)
    return paths


def evidence_markdown(summary: dict, teacher: dict, verdicts: dict, threshold: float) -> str:
    """The tables of docs/evidence.md: the teacher check, one table per estimator and noise level, P1-P5."""
    f = lambda ms: f"{ms[0]:.1f} ± {ms[1]:.1f}" if not math.isnan(ms[1]) else f"{ms[0]:.1f}"  # noqa: E731
    st = lambda x: "never" if math.isinf(x) else f"{x:.0f}"  # noqa: E731
    lines = []
    if teacher:
        lines += [
            "| policy (same SFT model, before RL) | success % (mean ± SE over seeds) |",
            "|---|---|",
            f"| student (no rule in its prompt) | {f(teacher['student'])} |",
            f"| teacher (the rule in its prompt, `method=skill-prompt`) | {f(teacher['teacher'])} |",
            f"| teacher - student (pp) | {teacher['diff'][0]:+.1f} (game-paired SE {teacher['diff_game_se']:.1f}) |",
            "",
        ]
    for est, by_noise in summary.items():
        for noise, rows in by_noise.items():
            lines += [
                f"**{est} estimator, {noise}** (threshold {threshold:.0f} % training success)",
                "",
                "| method | seeds | final success % | IQM [95 % CI] | P(improve over grpo) [95 % CI] | "
                "after - grpo, game-paired [95 % CI] | steps to threshold (mean curve; per seed) | s/run |",
                "|---|---|---|---|---|---|---|---|",
            ]
            for m, r in rows.items():
                iqm = f"{r['iqm']:.1f} [{r['iqm_ci'][0]:.1f}, {r['iqm_ci'][1]:.1f}]" if "iqm" in r else "-"
                pi = (
                    f"{r['p_improve']:.2f} [{r['p_improve_ci'][0]:.2f}, {r['p_improve_ci'][1]:.2f}]"
                    if "p_improve" in r
                    else "-"
                )
                vs = (
                    f"{r['vs_grpo'][0]:+.1f} [{r['vs_grpo'][1]:+.1f}, {r['vs_grpo'][2]:+.1f}]"
                    if "vs_grpo" in r
                    else "-"
                )
                per = ", ".join(st(x) for x in r["steps_to_per_seed"])
                lines.append(
                    f"| {m} | {len(r['seeds'])} | {f(r['after'])} | {iqm} | {pi} | {vs} | {st(r['steps_to'])}; {per} | "
                    f"{r['wall'][0]:.0f} |"
                )
            lines.append("")
    for p, v in verdicts.items():
        lines.append(f"- **{p}**: {'holds' if v.get('holds') else 'does not hold'}")
    return "\n".join(lines) + "\n"


def trace_distillation(
    run_dir: Path, rule: str = "pcsd", games: int = 48, lr: float = 1.0, seed: int = 0, optimizer: str = "sgd"
) -> dict:
    """Issue 38 item 5: does distillation push the student towards the rule? On the env expert's
    (the rule's) episodes scored by the warm-up model of ``run_dir`` with and without the rule in the
    prompt: the teacher's gap on the rule's tokens (the code's moves) and elsewhere, ``rule``'s weights
    there, the gradient of the distillation loss w.r.t. the student's log-probs there (negative: a
    descent step raises them), and one step (``optimizer``: ``sgd``, the first-order check, or
    ``adamw``, the trainer's) of ``lr`` on the distillation loss alone: the student's mean log-prob
    of the teacher-favoured rule tokens (the rule's tokens where the teacher's gap is positive)
    before and after."""
    import numpy as np
    import torch
    from omegaconf import OmegaConf

    from pcsd.diagnostics.alignment import expert_pairs, score_contexts
    from pcsd.diagnostics.cli import _env_expert_episodes
    from pcsd.diagnostics.robustness import token_weights
    from pcsd.envs import registry
    from pcsd.models import eos_id, load_model
    from pcsd.ops.losses import pcsd_token_loss
    from pcsd.ops.scoring import score_packed
    from pcsd.ops.weighting import get_rule
    from pcsd.text.prompts import PromptBuilder
    from pcsd.train.config import load_config
    from pcsd.train.job import skill_repository

    cfg = load_config(base=OmegaConf.load(Path(run_dir) / "config.yaml"))
    model_dir = _model(Path(run_dir))
    kind = registry.get(str(cfg.env.name))
    torch.manual_seed(seed)
    model = load_model(model_dir, torch.device("cpu"), "float32").eval()
    builder = PromptBuilder(
        kind.prompt,
        history_length=cfg.env.history_length,
        max_prompt_tokens=cfg.rollout.max_prompt_tokens,
        tokenizer_dir=model_dir,
        skills=skill_repository(cfg),
        template=kind.template(cfg, Path(run_dir)),
    )
    episodes, _ = _env_expert_episodes(cfg, games)
    pairs = expert_pairs(episodes)
    sc = score_contexts(model, builder, pairs, eos_id(builder), seed=seed)
    gap = (sc.logp["teacher"] - sc.logp["student"]).astype(np.float32)
    cu = sc.cu_seqlens
    # the rule's tokens: the action's tokens after its verb (the code's moves)
    verb_len = [len(builder.tokenizer.encode(p.action.split()[0])) for p in pairs]
    code = np.zeros_like(sc.action_mask)
    seg = np.repeat(np.arange(cu.size - 1), np.diff(cu))
    for i in range(cu.size - 1):
        idx = np.nonzero(sc.action_mask & (seg == i))[0]
        code[idx[verb_len[i] :]] = True
    mask = np.ones_like(gap, dtype=bool)
    params = get_rule(rule).params_from(cfg.algo.pcsd) if get_rule(rule).kind == "weights" else {}
    w = token_weights(rule, gap, mask, cu, **params)
    # the distillation loss on the student's log-probs (grad on), its gradient, one AdamW step
    reqs = [p.request for p in pairs]
    prompts = builder.encode_batch(reqs)
    lengths = np.diff(cu)
    tok = builder.tokenizer
    responses = []
    for p in pairs:
        think = __import__("pcsd.train.sft", fromlist=["think_for"]).think_for(p.request["task"], p.action, True)
        responses.append(
            tok.encode(f"<think>{think}</think><action>")
            + tok.encode(p.action)
            + tok.encode("</action>")
            + [eos_id(builder)]
        )
    assert [len(r) for r in responses] == lengths.tolist()
    model.train()
    lp = torch.cat(score_packed(model, prompts, responses))
    lp.retain_grad()
    teacher = torch.as_tensor(sc.logp["teacher"])
    M = float(mask.sum())
    loss = pcsd_token_loss(lp, teacher, torch.as_tensor(w, dtype=torch.float32), torch.as_tensor(mask)).sum() / M
    opt = (
        torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
        if optimizer == "adamw"
        else torch.optim.SGD(model.parameters(), lr=lr)
    )
    opt.zero_grad()
    loss.backward()
    grad = lp.grad.detach().numpy()
    before = lp.detach().numpy()
    opt.step()
    model.eval()
    with torch.no_grad():
        after = torch.cat(score_packed(model, prompts, responses)).numpy()
    other = sc.action_mask == False  # noqa: E712
    fav = code & (gap > 0)
    mean = lambda x, m: float(np.mean(x[m])) if m.any() else float("nan")  # noqa: E731
    return dict(
        rule=rule,
        pairs=len(pairs),
        rule_tokens=int(code.sum()),
        gap_rule_tokens=mean(gap, code),
        gap_other_tokens=mean(gap, other),
        share_rule_tokens_gap_positive=float(np.mean(gap[code] > 0)),
        weight_rule_tokens=mean(w, code),
        weight_other_tokens=mean(w, other),
        grad_rule_tokens=mean(grad, code),
        grad_other_tokens=mean(grad, other),
        student_logp_rule_before=mean(before, code),
        student_logp_rule_after=mean(after, code),
        favoured_tokens=int(fav.sum()),
        student_logp_favoured_before=mean(before, fav),
        student_logp_favoured_after=mean(after, fav),
        optimizer=optimizer,
        teacher_logp_rule=mean(sc.logp["teacher"], code),
        lr=lr,
    )


def evidence_main(args: argparse.Namespace, overrides: list[str]) -> int:
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    methods = [m.strip() for m in (args.methods or ",".join(EVIDENCE_METHODS)).split(",") if m.strip()]
    estimators = [e.strip() for e in args.estimators.split(",") if e.strip()]
    noises = [n.strip() for n in args.noise.split(",") if n.strip()]
    for m in methods:
        for e in estimators:
            for n in noises:
                evidence_overrides(m, e, n)  # an unknown entry fails before any run
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    warm = args.warm_up.resolve() if args.warm_up else None
    t0 = time.time()
    if args.collect:
        _, teacher = run_all(
            [], seeds, out, ["preset=tiny-cpu-evidence", *overrides], args.timeout, True, warm, 1, False
        )
        res = dict(teacher=teacher, cells=collect_evidence(out, seeds, methods, estimators, noises))
    else:
        res = run_evidence(
            seeds,
            out,
            overrides,
            methods=methods,
            estimators=estimators,
            noises=noises,
            jobs=args.jobs,
            timeout=args.timeout,
            warm_up=warm,
        )
    summary = summarize_evidence(res["cells"], args.threshold)
    teacher = summarize_teacher(res["teacher"])
    verdicts = judge(summary)
    figs = plot_evidence(summary, out, args.threshold)
    md = evidence_markdown(summary, teacher, verdicts, args.threshold)
    (out / "evidence.md").write_text(md)
    print(md)
    from pcsd.bench.common import machine_line

    (out / "evidence.json").write_text(
        json.dumps(
            dict(
                machine=machine_line(),
                overrides=overrides,
                seeds=seeds,
                methods=methods,
                estimators=estimators,
                noise_levels={n: NOISE_LEVELS[n] for n in noises},
                threshold=args.threshold,
                wall_seconds=time.time() - t0,
                teacher_check=teacher,
                summary=summary,
                verdicts=verdicts,
                figures=[str(p) for p in figs],
            ),
            indent=2,
            default=lambda x: None if isinstance(x, float) and math.isinf(x) else str(x),
        )
    )
    print(f"wrote {out / 'evidence.md'}, {out / 'evidence.json'} and {', '.join(str(p) for p in figs)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    overrides: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, overrides = argv[:cut], argv[cut + 1 :]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", default=",".join(DEFAULT_METHODS))
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--baseline", default="grpo")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "compare-methods")
    ap.add_argument("--json", type=Path, help="default <out>/compare.json")
    ap.add_argument("--timeout", type=float, default=7200.0, help="seconds per pcsd.train run")
    ap.add_argument(
        "--warm-up",
        type=Path,
        help="one finished warm-up run directory (method=vanilla with "
        "the same overrides) for every seed: the seeds then vary the RL only",
    )
    ap.add_argument("--jobs", type=int, default=1, help="method runs at a time (each with cores/jobs threads)")
    ap.add_argument(
        "--collect",
        action="store_true",
        help="train nothing: summarize the runs under --out that finished (a partial comparison)",
    )
    ap.add_argument(
        "--no-teacher-check",
        action="store_true",
        help="skip the teacher check (the SFT model evaluated with the skills in its prompt)",
    )
    ap.add_argument(
        "--evidence",
        action="store_true",
        help="the evidence comparison (docs/evidence.md): preset tiny-cpu-evidence, --methods default "
        "every rule, the ablations and the negative control, under --estimators at --noise levels",
    )
    ap.add_argument("--estimators", default=",".join(EVIDENCE_ESTIMATORS), help="--evidence: the estimators")
    ap.add_argument("--noise", default=",".join(NOISE_LEVELS), help="--evidence: the noise levels")
    ap.add_argument("--threshold", type=float, default=60.0, help="--evidence: the success threshold (%%)")
    args = ap.parse_args(argv)
    if args.evidence:
        if "--methods" not in " ".join(argv):
            args.methods = None
        sys.path.insert(0, str(ROOT))
        return evidence_main(args, overrides)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    sys.path.insert(0, str(ROOT))
    for m in methods:
        entry_overrides(m)  # an unknown entry fails before any run
    if args.baseline not in methods:
        methods.insert(0, args.baseline)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    runs, teacher = run_all(
        methods,
        seeds,
        out,
        overrides,
        args.timeout,
        not args.no_teacher_check,
        args.warm_up.resolve() if args.warm_up else None,
        args.jobs,
        not args.collect,
    )
    summary = summarize(runs, args.baseline)
    teacher_summary = summarize_teacher(teacher)
    if teacher_summary:
        t = teacher_summary
        print(
            f"teacher check (same SFT model, before RL; mean ± SE over seeds): student without skills "
            f"{t['student'][0]:.1f} ± {t['student'][1]:.1f} %, teacher with skills {t['teacher'][0]:.1f} ± "
            f"{t['teacher'][1]:.1f} %, difference {t['diff'][0]:+.1f} ± {t['diff'][1]:.1f} pp "
            f"(game-paired SE {t['diff_game_se']:.1f})"
        )
    report(summary, args.baseline, runs)
    figs = plot(runs, out)
    (out / "compare.md").write_text(markdown(summary, args.baseline, runs, teacher_summary))
    from pcsd.bench.common import machine_line

    (args.json or out / "compare.json").write_text(
        json.dumps(
            dict(
                machine=machine_line(),
                overrides=overrides,
                seeds=seeds,
                baseline=args.baseline,
                wall_seconds=time.time() - t0,
                load_end=list(os.getloadavg()),
                summary=summary,
                teacher_check=teacher_summary,
                teacher_runs=teacher,
                runs=runs,
                figures=[str(p) for p in figs],
            ),
            indent=2,
        )
    )
    print(f"wrote {(args.json or out / 'compare.json')} and {', '.join(str(p) for p in figs)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
