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
    args = ap.parse_args(argv)
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
