"""Output of the diagnostics: rich tables, ``diagnostics.json`` and PNG figures in the layout of the
paper's two appendix figures (rank preservation: grouped bars per perturbation fraction with
error bars over the draws; quality alignment: one scatter panel per perturbation, dQ against dW,
each method's linear fit, PCSD solid and SDAR dashed, Spearman in the legend)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from pcsd.diagnostics.alignment import PAPER_QUALITY_ALIGNMENT, PERTURBATIONS
from pcsd.diagnostics.robustness import PAPER_RANK_ROBUSTNESS

__all__ = [
    "robustness_table",
    "alignment_table",
    "write_json",
    "plot_rank_robustness",
    "plot_quality_alignment",
    "FIGURE_RULES",
]

FIGURE_RULES = ("pcsd", "sdar")
_LABEL = {"pcsd": "PCSD", "sdar": "SDAR", "sdar-norm": "SDAR (normalised)"}
_COLOR = {"pcsd": "#1f77b4", "sdar": "#d62728", "sdar-norm": "#ff7f0e"}


def _fmt(x: float, nd: int = 3) -> str:
    return "nan" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def robustness_table(res: dict):
    from rich.table import Table

    fr = res["fractions"]
    t = Table(
        title=f"Rank robustness: Spearman(original, perturbed weights), spikes of {res['magnitude']:g} "
        f"({res['sign']}), {res['repeats']} draws; {res['num_valid']} valid tokens, "
        f"{res['num_segments']} turns [{res['source']}]"
    )
    t.add_column("rule")
    t.add_column("kind")
    for f in fr:
        t.add_column(f"{100 * float(f):g} % mean ± sd", justify="right")
    t.add_column("paper", justify="right")
    for r, d in res["rules"].items():
        paper = PAPER_RANK_ROBUSTNESS.get(r)
        t.add_row(
            r,
            res["kinds"].get(r, ""),
            *[f"{_fmt(d[f]['mean'])} ± {_fmt(d[f]['std'])}" for f in fr],
            " / ".join(f"{v:.3f}" for v in paper) if paper else "",
        )
    return t


def alignment_table(res: dict):
    from rich.table import Table

    t = Table(
        title=f"Teacher-quality alignment: Spearman(dQ, dW) over {res['num_pairs']} expert state-action "
        f"pairs (mean gap with skills {res['gap_mean']:+.3f})"
    )
    t.add_column("rule")
    t.add_column("kind")
    for p in PERTURBATIONS:
        t.add_column(f"{p}: rho", justify="right")
        t.add_column(f"{p}: slope", justify="right")
    t.add_column("paper", justify="right")
    for r, d in res["rules"].items():
        paper = PAPER_QUALITY_ALIGNMENT.get(r)
        cells = []
        for p in PERTURBATIONS:
            cells += [_fmt(d[p]["spearman"]), _fmt(d[p]["slope"], 3)]
        t.add_row(r, res["kinds"].get(r, ""), *cells, " / ".join(f"{v:+.3f}" for v in paper) if paper else "")
    return t


def _clean(x):
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, (np.floating, np.integer)):
        return _clean(x.item())
    return x


def write_json(path: Path, payload: dict) -> Path:
    """Writes (merging with an existing file's other sections) ``payload``; NaN becomes null."""
    path = Path(path)
    data = {}
    if path.is_file():
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError:
            data = {}
    data.update(_clean(payload))
    path.write_text(json.dumps(data, indent=2))
    return path


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_rank_robustness(res: dict, path: Path, rules: Sequence[str] = FIGURE_RULES, paper: bool = True) -> Path:
    """Grouped bars (one group per fraction, one bar per rule) of the mean Spearman with the
    standard deviation over the draws as error bars; the paper's means as hollow markers."""
    plt = _plt()
    rules = [r for r in rules if r in res["rules"]]
    fr = res["fractions"]
    x = np.arange(len(fr))
    width = 0.8 / max(len(rules), 1)
    fig, ax = plt.subplots(figsize=(4.2 if len(rules) <= 2 else 8, 3.2))
    lo = 1.0
    for i, r in enumerate(rules):
        m = np.array([res["rules"][r][f]["mean"] for f in fr])
        s = np.array([res["rules"][r][f]["std"] for f in fr])
        xs = x - 0.4 + width * (i + 0.5)
        ax.bar(xs, m, width, yerr=s, capsize=3, label=_LABEL.get(r, r), color=_COLOR.get(r), alpha=0.85)
        for xi, mi in zip(xs, m):
            ax.text(xi, mi + 0.004, f"{mi:.3f}", ha="center", va="bottom", fontsize=6)
        lo = min(lo, float(np.nanmin(m - s)))
        if paper and r in PAPER_RANK_ROBUSTNESS:
            ax.scatter(
                xs,
                PAPER_RANK_ROBUSTNESS[r],
                marker="o",
                facecolors="none",
                edgecolors="k",
                s=18,
                zorder=3,
                label="paper" if i == 0 else None,
            )
            lo = min(lo, min(PAPER_RANK_ROBUSTNESS[r]))
    ax.set_xticks(x, [f"{100 * float(f):g}%" for f in fr])
    ax.set_xlabel("perturbation fraction")
    ax.set_ylabel("Spearman correlation")
    ax.set_ylim(max(0.0, lo - 0.05), 1.0)
    ax.legend(fontsize=7, ncol=2 if len(rules) > 4 else 1, loc="lower left")
    ax.set_title("Rank preservation under isolated gap spikes", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return Path(path)


def plot_quality_alignment(res: dict, path: Path, rules: Sequence[str] = FIGURE_RULES) -> Path:
    """One panel per perturbation (skills removed, shuffled skill): dQ against dW per rule with its
    least-squares line (first rule solid, the others dashed) and Spearman's rho in the legend."""
    plt = _plt()
    rules = [r for r in rules if r in res["rules"]]
    titles = {"removed": "Skill removal", "shuffled": "Shuffled skill"}
    fig, axes = plt.subplots(1, len(PERTURBATIONS), figsize=(9, 3.6))
    for ax, p in zip(np.atleast_1d(axes), PERTURBATIONS):
        dq = np.asarray(res["dQ"][p])
        for i, r in enumerate(rules):
            d = res["rules"][r][p]
            dw = np.asarray(d["dW"])
            c = _COLOR.get(r)
            ax.scatter(dq, dw, s=6, alpha=0.35, color=c)
            rho = d["spearman"]
            lab = f"{_LABEL.get(r, r)} (rho = {_fmt(rho)})"
            if not (d["slope"] is None or math.isnan(d["slope"])):
                xs = np.linspace(dq.min(), dq.max(), 50)
                ax.plot(xs, d["slope"] * xs + d["intercept"], "-" if i == 0 else "--", color=c, lw=1.6, label=lab)
            else:
                ax.plot([], [], color=c, label=lab)
        ax.axhline(0, color="0.7", lw=0.6)
        ax.axvline(0, color="0.7", lw=0.6)
        ax.set_title(titles.get(p, p), fontsize=10)
        ax.set_xlabel(r"$\Delta Q$ (teacher confidence)")
        ax.set_ylabel(r"$\Delta W$ (token weight)")
        ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return Path(path)


def out_dir_for(out: Optional[str], run_dir: Optional[str]) -> Path:
    """``--out``, else ``<run dir>/diagnostics``, else ``runs/diagnostics``."""
    d = Path(out) if out else (Path(run_dir) / "diagnostics" if run_dir else Path("runs") / "diagnostics")
    d.mkdir(parents=True, exist_ok=True)
    return d
