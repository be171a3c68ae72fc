"""Methods x seeds on the same evaluation games (not a test): success before/after RL with paired
standard errors, and each method's mean gap and gate activation per step.

    python benchmarks/compare_methods.py                                   # 6 methods x 3 seeds, tiny-cpu
    python benchmarks/compare_methods.py --methods grpo,pcsd --seeds 0,1,2 --out runs/compare
    python benchmarks/compare_methods.py --methods grpo,skill-sd --seeds 0,1 -- optim.steps=1 ...

Per seed the warm-up (the tiny model, its tokenizer and the SFT on the expert) runs once
(``method=vanilla``, i.e. ``optim.steps=0``: it also gives the evaluation before RL), and every
method starts RL from that ``sft-model/`` (``model.path=... optim.sft_steps=0``), so within a seed
the methods differ only in their RL. The evaluation games are the trainer's fixed list (their seed
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


def _train(args: list[str], timeout: float, log: Path) -> float:
    cmd = [sys.executable, "-m", "pcsd.train", *args]
    print(f"$ {' '.join(cmd)}", flush=True)
    t0 = time.time()
    with open(log, "w") as f:
        proc = subprocess.run(cmd, cwd=ROOT, timeout=timeout, stdout=f, stderr=subprocess.STDOUT)
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


def _mean_se(xs: list[float]) -> tuple[float, float]:
    n = len(xs)
    if not n:
        return float("nan"), float("nan")
    m = sum(xs) / n
    if n < 2:
        return m, float("nan")
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    return m, sd / math.sqrt(n)


def run_all(methods: list[str], seeds: list[int], out: Path, overrides: list[str], timeout: float) -> dict:
    runs: dict = {}
    for seed in seeds:
        warm = out / f"seed-{seed}" / "warm-up"
        if not (warm / "summary.json").is_file():
            _train([f"run.dir={warm}", "method=vanilla", f"run.seed={seed}", *overrides], timeout, out / f"warm-up-{seed}.log")
        model = warm / "sft-model" if (warm / "sft-model" / "config.json").is_file() else warm / "base-model"
        for m in methods:
            rd = out / f"seed-{seed}" / m
            if not (rd / "summary.json").is_file():
                wall = _train([f"run.dir={rd}", f"method={m}", f"run.seed={seed}", f"model.path={model}",
                               *overrides, "optim.sft_steps=0"], timeout, out / f"{m}-{seed}.log")
            else:
                wall = float("nan")
            s = json.loads((rd / "summary.json").read_text())
            runs.setdefault(m, {})[seed] = dict(
                dir=str(rd), before=s["success_before"], after=s["success_after"], wall=s.get("wall_seconds", wall),
                games_before=[int(g["won"]) for g in _games(rd, "before")],
                games_after=[int(g["won"]) for g in _games(rd, "after")],
                game_names=[_game_key(g["game"]) for g in _games(rd, "after")],
                curve=[dict(step=r["step"], gap=r["gap_mean"], gate=r["gate_activation"],
                            success=r.get("success")) for r in _metrics(rd)])
    return runs


def summarize(runs: dict, baseline: str) -> dict:
    out: dict = {}
    base = runs.get(baseline, {})
    for m, per in runs.items():
        seeds = sorted(per)
        rises = [per[s]["after"] - per[s]["before"] for s in seeds]
        row = dict(seeds=seeds, before=_mean_se([per[s]["before"] for s in seeds]),
                   after=_mean_se([per[s]["after"] for s in seeds]), rise=_mean_se(rises))
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
    for c in ("method", "seeds", "before %", "after %", "rise (pp)", f"after - {baseline} (pp)", "game-paired SE",
              "mean gap (last step)", "gate (last step)"):
        t.add_column(c, justify="right")
    f = lambda ms: f"{ms[0]:.1f} ± {ms[1]:.1f}" if not math.isnan(ms[1]) else f"{ms[0]:.1f}"  # noqa: E731
    for m, r in summary.items():
        last = [runs[m][s]["curve"][-1] for s in r["seeds"] if runs[m][s]["curve"]]
        gap = sum(x["gap"] for x in last) / len(last) if last else float("nan")
        gate = sum(x["gate"] for x in last) / len(last) if last else float("nan")
        t.add_row(m, str(len(r["seeds"])), f(r["before"]), f(r["after"]), f(r["rise"]),
                  f(r["vs_base"]) if "vs_base" in r else "-",
                  f"{r['vs_base_game_se']:.1f}" if "vs_base_game_se" in r else "-", f"{gap:+.3f}", f"{gate:.3f}")
    Console(width=None if sys.stdout.isatty() else 180).print(t)


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
        argv, overrides = argv[:cut], argv[cut + 1:]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", default=",".join(DEFAULT_METHODS))
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--baseline", default="grpo")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "compare-methods")
    ap.add_argument("--json", type=Path, help="default <out>/compare.json")
    ap.add_argument("--timeout", type=float, default=7200.0, help="seconds per pcsd.train run")
    args = ap.parse_args(argv)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    sys.path.insert(0, str(ROOT))
    from pcsd.train.methods import canonical_method

    for m in methods:
        canonical_method(m)  # an unknown method fails before any run
    if args.baseline not in methods:
        methods.insert(0, args.baseline)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    runs = run_all(methods, seeds, out, overrides, args.timeout)
    summary = summarize(runs, args.baseline)
    report(summary, args.baseline, runs)
    figs = plot(runs, out)
    from pcsd.bench.common import machine_line

    (args.json or out / "compare.json").write_text(json.dumps(dict(
        machine=machine_line(), overrides=overrides, seeds=seeds, baseline=args.baseline, wall_seconds=time.time() - t0,
        load_end=list(os.getloadavg()), summary=summary, runs=runs, figures=[str(p) for p in figs]), indent=2))
    print(f"wrote {(args.json or out / 'compare.json')} and {', '.join(str(p) for p in figs)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
